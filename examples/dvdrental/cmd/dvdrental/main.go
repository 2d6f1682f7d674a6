package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/lib/pq"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "initdb":
		err = initDB(os.Args[2:])
	case "rent", "return", "create-user":
		err = request(os.Args[1], os.Args[2:])
	case "probe-db":
		os.Exit(probeDB(os.Args[2:]))
	case "charges":
		err = charges(os.Args[2:])
	case "customers":
		err = customers(os.Args[2:])
	case "demo":
		err = runDemo(os.Args[2:])
	case "cluster":
		err = runCluster(os.Args[2:])
	case "db":
		err = runDB(os.Args[2:])
	case "mq":
		err = runMQ(os.Args[2:])
	case "idle":
		err = idle()
	case "ready":
		err = ready(os.Args[2:])
	case "compromise":
		err = compromise(os.Args[2:])
	case "monitor":
		err = runMonitor(os.Args[2:])
	case "monitor-ctl":
		err = monitorCtl(os.Args[2:])
	case "wait-alert":
		err = waitAlert(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "dvdrental %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprint(os.Stderr, `usage:
  dvdrental serve contract-update|user-update|user-create|dvd-update|shipping|dvd-return [flags]
  dvdrental initdb --db HOST:PORT            create the schema, customers alice and bob, DVDs d1-d3
  dvdrental rent --url URL --rental R --user U --dvd D
  dvdrental return --url URL --rental R --user U --dvd D
  dvdrental create-user --url URL --user U
  dvdrental probe-db --db HOST:PORT          exit 0: connected and read; 3: no connection (timeout)
  dvdrental charges --db HOST:PORT           the charges table, one "rental user amount" per line
  dvdrental customers --db HOST:PORT         the customers, one name per line
  dvdrental demo --socket SOCK --work DIR    the demo's driver (scripts/demo-dvdrental.sh runs it)
  dvdrental cluster --kubeconfig F --kubectl K   the cluster form's driver (demo-dvdrental.sh --cluster)
In the cluster form's pods (examples/dvdrental/cluster/):
  dvdrental db --data DIR                    initdb, PostgreSQL, the store's tables
  dvdrental mq                               mosquitto on :1883
  dvdrental idle                             wait for SIGTERM (the customer's pod)
  dvdrental ready tcp:ADDR|http://...|file:PATH   exit 0 when it answers (readiness probes)
  dvdrental compromise [MODE]                write MODE ("" = honest) to /tmp/compromised
  dvdrental monitor --dir DIR                run Suricata as monitor-ctl says, on tap-rx/tap-tx
  dvdrental monitor-ctl --dir DIR --mode off|passive|ips [--rule R]... [--lua]
  dvdrental wait-alert --dir DIR --sid N --action allowed|blocked [--timeout D]
`)
	os.Exit(2)
}

// Rental is what travels between the services: the rental, the customer and the DVD.
type Rental struct {
	Rental string `json:"rental"`
	User   string `json:"user"`
	DVD    string `json:"dvd,omitempty"`
	Amount int    `json:"amount,omitempty"`
}

// price is what a rental costs, in cents.
const price = 399

type config struct {
	listen, db, broker, userUpdate, shipping, record, compromised, compromisedFile string
}

// mode is how the service behaves now: --compromised, or, with --compromised-file, what
// that file says at this request (missing or empty: as built). The cluster form turns a
// running pod into the attacker's this way, with `dvdrental compromise` in the pod,
// where a restart would give the pod a new address and a new name to wait for.
func (c *config) mode() string {
	if c.compromisedFile == "" {
		return c.compromised
	}
	b, err := os.ReadFile(c.compromisedFile)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func serve(args []string) error {
	if len(args) < 1 {
		usage()
	}
	service := args[0]
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	var c config
	fs.StringVar(&c.listen, "listen", ":8080", "HTTP address")
	fs.StringVar(&c.db, "db", "", "PostgreSQL HOST:PORT")
	fs.StringVar(&c.broker, "mqtt", "", "MQTT broker HOST:PORT")
	fs.StringVar(&c.userUpdate, "user-update", "", "user-update's URL")
	fs.StringVar(&c.shipping, "shipping", "", "shipping's URL")
	fs.StringVar(&c.record, "record", "", "shipping: file the shipments are appended to, one JSON line each")
	fs.StringVar(&c.compromised, "compromised", "", "contract-update: bill-other (bill bob for every rental); user-create: read-user (also read alice's record)")
	fs.StringVar(&c.compromisedFile, "compromised-file", "", "read the --compromised mode from this file at each request (`dvdrental compromise` writes it)")
	fs.Parse(args[1:])
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	mux := http.NewServeMux()
	switch service {
	case "contract-update":
		q, err := connectMQTT(c.broker, "contract-update")
		if err != nil {
			return err
		}
		defer q.Disconnect(250)
		mux.HandleFunc("POST /rent", func(w http.ResponseWriter, r *http.Request) {
			var in Rental
			if !decode(w, r, &in) {
				return
			}
			bill := Rental{Rental: in.Rental, User: in.User, Amount: price}
			if c.mode() == "bill-other" {
				bill.User = "bob" // the attack: Alice rents, Bob pays
			}
			if err := post(r.Context(), c.userUpdate+"/bill", bill); err != nil {
				http.Error(w, "billing: "+err.Error(), http.StatusBadGateway)
				return
			}
			msg, _ := json.Marshal(in)
			if t := q.Publish("rentals", 1, false, msg); !t.WaitTimeout(5*time.Second) || t.Error() != nil {
				http.Error(w, fmt.Sprintf("queueing the rental: %v", t.Error()), http.StatusBadGateway)
				return
			}
			reply(w, in)
		})
	case "user-update":
		db, err := openDB(c.db)
		if err != nil {
			return err
		}
		defer db.Close()
		mux.HandleFunc("POST /bill", func(w http.ResponseWriter, r *http.Request) {
			var in Rental
			if !decode(w, r, &in) {
				return
			}
			if err := charge(r.Context(), db, in.Rental, in.User, in.Amount); err != nil {
				http.Error(w, err.Error(), http.StatusConflict)
				return
			}
			reply(w, in)
		})
	case "user-create":
		db, err := openDB(c.db)
		if err != nil {
			return err
		}
		defer db.Close()
		mux.HandleFunc("POST /users", func(w http.ResponseWriter, r *http.Request) {
			var in Rental
			if !decode(w, r, &in) {
				return
			}
			if _, err := db.ExecContext(r.Context(), "INSERT INTO users (name, balance) VALUES ($1, 0)", in.User); err != nil {
				http.Error(w, err.Error(), http.StatusConflict)
				return
			}
			if c.mode() == "read-user" {
				// The attack: a service that may only create customers reads one.
				var balance int
				qctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
				defer cancel()
				err := db.QueryRowContext(qctx, "SELECT balance FROM users WHERE name = 'alice'").Scan(&balance)
				if err != nil {
					http.Error(w, "reading alice: "+err.Error(), http.StatusBadGateway)
					return
				}
				fmt.Fprintf(os.Stderr, "user-create: read alice's balance: %d\n", balance)
			}
			reply(w, in)
		})
	case "dvd-update":
		db, err := openDB(c.db)
		if err != nil {
			return err
		}
		defer db.Close()
		q, err := connectMQTT(c.broker, "dvd-update")
		if err != nil {
			return err
		}
		defer q.Disconnect(250)
		handle := func(topic string, fn func(context.Context, Rental) error) error {
			t := q.Subscribe(topic, 1, func(_ mqtt.Client, m mqtt.Message) {
				var in Rental
				if err := json.Unmarshal(m.Payload(), &in); err != nil {
					fmt.Fprintf(os.Stderr, "dvd-update: %s: %v\n", topic, err)
					return
				}
				ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				if err := fn(ctx, in); err != nil {
					fmt.Fprintf(os.Stderr, "dvd-update: %s %s: %v\n", topic, in.Rental, err)
				}
			})
			if !t.WaitTimeout(5*time.Second) || t.Error() != nil {
				return fmt.Errorf("subscribing to %s: %v", topic, t.Error())
			}
			return nil
		}
		if err := handle("rentals", func(ctx context.Context, in Rental) error {
			if _, err := db.ExecContext(ctx, "UPDATE dvds SET rented_by = $1 WHERE id = $2", in.User, in.DVD); err != nil {
				return err
			}
			return post(ctx, c.shipping+"/ship", in)
		}); err != nil {
			return err
		}
		if err := handle("returns", func(ctx context.Context, in Rental) error {
			_, err := db.ExecContext(ctx, "UPDATE dvds SET rented_by = NULL WHERE id = $1 AND rented_by = $2", in.DVD, in.User)
			return err
		}); err != nil {
			return err
		}
	case "shipping":
		var mu sync.Mutex
		mux.HandleFunc("POST /ship", func(w http.ResponseWriter, r *http.Request) {
			var in Rental
			if !decode(w, r, &in) {
				return
			}
			if c.record != "" {
				mu.Lock()
				err := appendLine(c.record, in)
				mu.Unlock()
				if err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
			}
			reply(w, in)
		})
	case "dvd-return":
		q, err := connectMQTT(c.broker, "dvd-return")
		if err != nil {
			return err
		}
		defer q.Disconnect(250)
		mux.HandleFunc("POST /return", func(w http.ResponseWriter, r *http.Request) {
			var in Rental
			if !decode(w, r, &in) {
				return
			}
			msg, _ := json.Marshal(in)
			if t := q.Publish("returns", 1, false, msg); !t.WaitTimeout(5*time.Second) || t.Error() != nil {
				http.Error(w, fmt.Sprintf("queueing the return: %v", t.Error()), http.StatusBadGateway)
				return
			}
			reply(w, in)
		})
	default:
		return fmt.Errorf("unknown service %q", service)
	}
	// Ready once listening: dvd-update has subscribed to the queue by then.
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { reply(w, "ok") })
	srv := &http.Server{Addr: c.listen, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	fmt.Fprintf(os.Stderr, "%s: listening on %s\n", service, c.listen)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// charge bills user for rental in one transaction: the charge is recorded and the balance
// lowered, or neither.
func charge(ctx context.Context, db *sql.DB, rental, user string, amount int) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, "UPDATE users SET balance = balance - $1 WHERE name = $2", amount, user)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("no customer %q", user)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO charges (rental, username, amount) VALUES ($1, $2, $3)", rental, user, amount); err != nil {
		return err
	}
	return tx.Commit()
}

func connectMQTT(addr, id string) (mqtt.Client, error) {
	if addr == "" {
		return nil, errors.New("--mqtt is required")
	}
	o := mqtt.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).
		SetConnectTimeout(5 * time.Second).SetAutoReconnect(true).SetConnectRetry(false)
	// Retried for 30 s: in a cluster the broker's pod, or its name, may come up after the
	// service's.
	deadline := time.Now().Add(30 * time.Second)
	for {
		c := mqtt.NewClient(o)
		t := c.Connect()
		if t.WaitTimeout(10*time.Second) && t.Error() == nil {
			return c, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("connecting to the broker at %s: %v", addr, t.Error())
		}
		time.Sleep(500 * time.Millisecond) // the broker is not up yet: try again
	}
}

func openDB(addr string) (*sql.DB, error) { return openDBNamed(addr, "dvd") }

func openDBNamed(addr, name string) (*sql.DB, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("--db %q: %w", addr, err)
	}
	// Plain text on purpose: the monitor parses the PostgreSQL protocol on the tap.
	dsn := fmt.Sprintf("host=%s port=%s user=dvd dbname=%s sslmode=disable connect_timeout=3", host, port, name)
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(4)
	return db, nil
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(v); err != nil {
		http.Error(w, "bad request: "+err.Error(), http.StatusBadRequest)
		return false
	}
	return true
}

func reply(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// client sends each request on a connection of its own: a monitor that starts while a
// connection is open picks it up midstream, where its HTTP parser may not recognise the
// requests (docs/taps.md), and the demo starts its monitors while the store runs.
var client = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// post sends v as JSON to url and wants a 2xx answer.
func post(ctx context.Context, url string, v any) error {
	b, _ := json.Marshal(v)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

func appendLine(path string, v any) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	b, _ := json.Marshal(v)
	_, err = f.Write(append(b, '\n'))
	return errors.Join(err, f.Close())
}

// request is the customer's side: a rental, a return, a new customer.
func request(what string, args []string) error {
	fs := flag.NewFlagSet(what, flag.ExitOnError)
	url := fs.String("url", "", "the service's URL")
	var in Rental
	fs.StringVar(&in.Rental, "rental", "", "rental ID")
	fs.StringVar(&in.User, "user", "", "customer")
	fs.StringVar(&in.DVD, "dvd", "", "DVD ID")
	fs.Parse(args)
	path := map[string]string{"rent": "/rent", "return": "/return", "create-user": "/users"}[what]
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	return post(ctx, *url+path, in)
}

func initDB(args []string) error {
	fs := flag.NewFlagSet("initdb", flag.ExitOnError)
	addr := fs.String("db", "", "PostgreSQL HOST:PORT")
	fs.Parse(args)
	admin, err := openDBNamed(*addr, "postgres")
	if err != nil {
		return err
	}
	// The server listens before it accepts queries ("the database system is starting
	// up", SQLSTATE 57P03): poll until it does.
	for deadline := time.Now().Add(30 * time.Second); ; {
		_, err = admin.Exec("CREATE DATABASE dvd")
		var pe *pq.Error
		if err == nil || !errors.As(err, &pe) || pe.Code != "57P03" || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	admin.Close()
	if err != nil {
		return fmt.Errorf("creating database dvd: %w", err)
	}
	db, err := openDB(*addr)
	if err != nil {
		return err
	}
	defer db.Close()
	for _, s := range []string{
		"CREATE TABLE users (name text PRIMARY KEY, balance integer NOT NULL)",
		"CREATE TABLE charges (rental text NOT NULL, username text NOT NULL REFERENCES users(name), amount integer NOT NULL)",
		"CREATE TABLE dvds (id text PRIMARY KEY, title text NOT NULL, rented_by text REFERENCES users(name))",
		"INSERT INTO users VALUES ('alice', 10000), ('bob', 10000)",
		"INSERT INTO dvds VALUES ('d1', 'Metropolis', NULL), ('d2', 'Nosferatu', NULL), ('d3', 'Sunrise', NULL)",
	} {
		if _, err := db.Exec(s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// probeDB is what a compromised service tries: a connection to the database and a read.
func probeDB(args []string) int {
	fs := flag.NewFlagSet("probe-db", flag.ExitOnError)
	addr := fs.String("db", "", "PostgreSQL HOST:PORT")
	timeout := fs.Duration("timeout", 2*time.Second, "how long to wait for the connection")
	fs.Parse(args)
	conn, err := net.DialTimeout("tcp", *addr, *timeout)
	if err != nil {
		fmt.Printf("no connection to the database: %v\n", err)
		return 3
	}
	conn.Close()
	db, err := openDB(*addr)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer db.Close()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM users").Scan(&n); err != nil {
		fmt.Printf("connected, but the read failed: %v\n", err)
		return 1
	}
	fmt.Printf("connected and read the customers table (%d customers)\n", n)
	return 0
}

func charges(args []string) error {
	return printRows("charges", args, "SELECT rental, username, amount::text FROM charges ORDER BY rental, username")
}

func customers(args []string) error {
	return printRows("customers", args, "SELECT name FROM users ORDER BY name")
}

// printRows prints the rows of query (text columns), one line each, from the database
// the --db flag of args names.
func printRows(cmd string, args []string, query string) error {
	fs := flag.NewFlagSet(cmd, flag.ExitOnError)
	addr := fs.String("db", "", "PostgreSQL HOST:PORT")
	fs.Parse(args)
	db, err := openDB(*addr)
	if err != nil {
		return err
	}
	defer db.Close()
	rows, err := db.Query(query)
	if err != nil {
		return err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return err
	}
	vals := make([]string, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return err
		}
		fmt.Println(strings.Join(vals, " "))
	}
	return rows.Err()
}
