-- Request integrity (seeds/002, section V-A): a rental is billed to the customer who
-- rented it. The script sees the bodies of the HTTP requests of contract-update's tap: it
-- remembers each rental's customer from a rental request ({"rental", "user", "dvd"}) and
-- matches a billing request ({"rental", "user", "amount"}) for the same rental that names
-- another customer. The table lives in the Lua state of the detection thread: the monitor
-- runs one, so both directions of the tap meet here.
rentals = {}

function init(args)
	local needs = {}
	needs["http.request_body"] = tostring(true)
	return needs
end

function match(args)
	local body = tostring(args["http.request_body"])
	local rental = body:match('"rental"%s*:%s*"([^"]*)"')
	local user = body:match('"user"%s*:%s*"([^"]*)"')
	if rental == nil or user == nil then
		return 0
	end
	if body:find('"dvd"%s*:') then
		rentals[rental] = user
		return 0
	end
	if body:find('"amount"%s*:') then
		local renter = rentals[rental]
		if renter ~= nil and renter ~= user then
			return 1
		end
	end
	return 0
end
