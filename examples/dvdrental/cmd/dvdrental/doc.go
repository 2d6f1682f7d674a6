// Command dvdrental is the DVD rental application of the security-as-a-service paper
// (seeds/002, Fig. 1b), as small real services: contract-update takes a customer's rental,
// bills the customer through user-update and queues the DVD on the message broker
// (MQTT, mosquitto); dvd-update takes it from the queue, marks the DVD rented in the
// database (PostgreSQL) and has shipping ship it; dvd-return takes the DVD back;
// user-create adds customers. Each service is one `dvdrental serve SERVICE` process in its
// own endpoint; the demo (scripts/demo-dvdrental.sh) runs them with a real PostgreSQL and
// mosquitto, plays a rental and the paper's attacks, and checks every outcome.
//
// A service started with --compromised behaves as the paper's attacker would:
// contract-update bills another customer than the one renting (request integrity),
// user-create also reads a customer's record (request-specific connection policy).
// `dvdrental probe-db` is what a compromised shipping or dvd-return would try: a direct
// connection to the database (connection policy).
package main
