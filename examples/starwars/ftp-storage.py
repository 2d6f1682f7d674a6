#!/usr/bin/env python3
"""An FTP storage server for the Star Wars demo: a real FTP server (pyftpdlib).

storage-secure: python3 ftp-storage.py --name storage-secure --root DIR --user deathstar:PASS
storage-legacy: python3 ftp-storage.py --name storage-legacy --root DIR --user deathstar:PASS --anonymous-read

--anonymous-read is the legacy server's flaw: anyone can log in as "anonymous" and read
every file, including the deathstar's API log.

Passive mode: the client opens every data connection to a port the server picks from
--passive-ports (default 30000-30009), so a policy that limits the client's egress ports
must allow that range as well as 21 (see 03-deathstar-egress.yaml).
"""
import argparse
import logging
import sys

from pyftpdlib.authorizers import DummyAuthorizer
from pyftpdlib.handlers import FTPHandler
from pyftpdlib.servers import FTPServer


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--name", required=True, help="server name, shown in the greeting")
    p.add_argument("--root", required=True, help="directory served")
    p.add_argument("--listen", default="0.0.0.0", help="address to listen on")
    p.add_argument("--port", type=int, default=21, help="0: any free port (printed)")
    p.add_argument("--user", action="append", default=[], metavar="USER:PASSWORD",
                   help="an account with read and write access (repeatable)")
    p.add_argument("--anonymous-read", action="store_true",
                   help="let anyone log in as anonymous and read (the legacy server's flaw)")
    p.add_argument("--passive-ports", default="30000-30009", metavar="LOW-HIGH",
                   help='range of data connection ports; "" for any free port')
    a = p.parse_args()

    auth = DummyAuthorizer()
    for u in a.user:
        name, sep, password = u.partition(":")
        if not sep or not name:
            p.error("--user wants USER:PASSWORD, got %r" % u)
        auth.add_user(name, password, a.root, perm="elradfmw")
    if a.anonymous_read:
        auth.add_anonymous(a.root, perm="elr")  # list and read, no write

    handler = type("Handler", (FTPHandler,), {})
    handler.authorizer = auth
    if a.passive_ports:
        low, _, high = a.passive_ports.partition("-")
        handler.passive_ports = range(int(low), int(high or low) + 1)
    handler.banner = "%s ready" % a.name

    logging.basicConfig(stream=sys.stdout, level=logging.INFO,
                        format="%(asctime)s " + a.name + " %(message)s")
    server = FTPServer((a.listen, a.port), handler)
    host, port = server.socket.getsockname()[:2]
    print("%s: listening on %s:%d" % (a.name, host, port), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
