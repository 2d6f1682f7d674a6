# The DVD rental store's monitor policies (seeds/002, section V-A), for
# `rampart tap policy apply -f`. Monitors are endpoints made with --monitor and labelled
# with what they understand (inspects.rampart.io/<what>=true); placement is per node.

# Request-specific connection policy: every connection to the database passes through a
# monitor that parses PostgreSQL, inline: it lets user-create insert a customer and drops
# its query of one.
inspect(S, "pgsql", "ingress", "TCP", 5432, "redirect") :- label(S, "app", "db").

# Request integrity: contract-update's HTTP, in (the customers' rentals) and out (its
# billing requests to user-update), is copied to a monitor that checks a rental is billed
# to the customer who rented it. It detects; 03-tap-policy-inline.mg stops.
inspect(S, "http", "both", "TCP", 8080, "mirror") :- label(S, "app", "contract-update").
