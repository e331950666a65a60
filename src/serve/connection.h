// The TCP connection behind a request being handled, for noticing a client that hung up while
// its non-streamed answer is still being generated. cpp-httplib 0.11 (Debian 12's) hands
// handlers no socket and has no is_connection_closed(); the accepted socket is found instead
// among this process's descriptors by the addresses the request carries (a TCP connection is
// unique by its local and remote address and port).
#pragma once

#include <string>

namespace loom::serve {

// The socket whose local port is local_port and whose peer is remote_addr:remote_port (numeric,
// as cpp-httplib writes them), or -1 when there is none. Linux (/proc/self/fd).
int find_connection_socket(int local_port, const std::string& remote_addr, int remote_port);

// True once the peer has closed or reset the connection (POLLRDHUP / POLLHUP / POLLERR); data
// still unread does not hide it. Never blocks.
bool peer_closed(int fd);

}  // namespace loom::serve
