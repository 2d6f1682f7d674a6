# The DVD rental store's tap policy (seeds/002, section V), for `rampart tap policy apply`.
# Monitors are endpoints made with --monitor and labelled with what they understand, e.g.
#   rampart endpoint add dvd/ids-pg --monitor --labels inspects.rampart.io/pgsql=true

# Request-specific connection policy: every connection to the database passes through a
# monitor that parses PostgreSQL (it lets user-create insert a user, and drops a query).
inspect(S, "pgsql", "ingress", "TCP", 5432, "redirect") :- label(S, "app", "db").

# Request integrity: a rental starts at contract-update and follows the connections
# policy allows, short of the database; what those services publish to the message queue
# is copied to a monitor that checks one rental names one user throughout.
rental(S) :- label(S, "app", "contract-update").
rental(D) :- rental(S), talks(S, D, _, _), !label(D, "app", "db").
inspect(S, "mqtt", "egress", "TCP", 1883, "mirror") :-
    rental(S), talks(S, Q, "TCP", 1883), label(Q, "app", "mq").

# Whatever the outside can reach (policy admits the world) is copied to an HTTP monitor.
is_monitor(M) :- monitor(M, _).
inspect(S, "http", "ingress", "TCP", P, "mirror") :-
    exposed(S), port(S, "TCP", P), !is_monitor(S), !label(S, "app", "db").
