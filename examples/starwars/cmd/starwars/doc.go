// Command starwars holds the applications of the Star Wars demo (scripts/demo-starwars.sh,
// examples/starwars), run in endpoints with `rampart endpoint exec`:
//
//   - deathstar: the Empire's HTTP service. GET /v1 (status and the list of its public
//     APIs), POST /v1/request-landing, and the hidden PUT /v1/exhaust-port, which makes the
//     process exit. It keeps an API log (including every API it registered, hidden ones too)
//     and ships it over FTP to each --storage after every request, printing one line per
//     storage and round: "upload #N NAME: ok (...)" or "upload #N NAME: failed: ...".
//   - ship: an HTTP client for the tiefighter and the xwing. It prints one line whose first
//     word is the outcome: the HTTP status, or timeout (dropped), refused, closed, error.
//   - ftp-get: reads a file from an FTP server (anonymously unless the URL has a user), as
//     the rebels read the leaked log from storage-legacy.
//   - wait-tcp: waits until a server accepts connections.
//
// The FTP servers themselves are real ones (pyftpdlib, examples/starwars/ftp-storage.py).
package main
