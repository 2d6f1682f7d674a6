# The DVD rental store's monitor policies (seeds/002, section V-A), for
# `rampart tap policy apply -f`. Monitors are endpoints made with --monitor and labelled
# with what they understand (inspects.rampart.io/<what>=true); placement is per node.

# Request-specific connection policy: every connection to the database passes through a
# monitor that parses PostgreSQL, inline: it lets user-create insert a customer and drops
# its query of one.
inspect(S, "pgsql", "ingress", "TCP", 5432, "redirect") :- label(S, "app", "db").
