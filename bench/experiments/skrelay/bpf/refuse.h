/* Shared by the sk_msg prototypes: a refusal answered from the sender's own socket. The
 * includer provides the types and helpers (linux/bpf.h and bpf_helpers.h, or vmlinux.h). */
#ifndef SKRELAY_REFUSE_H
#define SKRELAY_REFUSE_H

static const char forbidden[] = "HTTP/1.1 403 Forbidden\r\ncontent-length: 15\r\n"
				"content-type: text/plain\r\n\r\nAccess denied\r\n";

/* refuse_to_self rewrites msg into the 403 above and redirects it into the receive queue
 * of the socket at key in sockhash map: the sender's own. */
static __always_inline int refuse_to_self(struct sk_msg_md *msg, void *map, void *key)
{
	__u32 want = sizeof(forbidden) - 1, len = msg->size;
	char *p;

	if (len > want) {
		if (bpf_msg_pop_data(msg, want, len - want, 0))
			return SK_DROP;
	} else if (len < want) {
		if (bpf_msg_push_data(msg, len, want - len, 0))
			return SK_DROP;
	}
	if (bpf_msg_pull_data(msg, 0, want, 0))
		return SK_DROP;
	p = msg->data;
	if ((void *)(p + sizeof(forbidden) - 1) > msg->data_end)
		return SK_DROP;
	__builtin_memcpy(p, forbidden, sizeof(forbidden) - 1);
	return bpf_msg_redirect_hash(msg, map, key, BPF_F_INGRESS);
}

#endif
