# The DVD rental store's monitor policies (seeds/002, section V-A) with the integrity
# monitor inline, for `rampart tap policy apply -f`. Monitors are endpoints made with --monitor and labelled
# with what they understand (inspects.rampart.io/<what>=true); placement is per node.

# Request-specific connection policy: every connection to the database passes through a
# monitor that parses PostgreSQL, inline: it lets user-create insert a customer and drops
# its query of one.
inspect(S, "pgsql", "ingress", "TCP", 5432, "redirect") :- label(S, "app", "db").

# Request integrity: contract-update's HTTP, in (the customers' rentals) and out (its
# billing requests to user-update), goes through a monitor that checks a rental is billed
# to the customer who rented it. Inline: a billing request for another customer is dropped.
inspect(S, "http", "both", "TCP", 8080, "redirect") :- label(S, "app", "contract-update").
