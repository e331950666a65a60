#include "serve/connection.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>

namespace loom::serve {
namespace {

// Numeric host and port of a socket address, as cpp-httplib's get_remote_ip_and_port writes it.
bool numeric(const sockaddr_storage& a, socklen_t len, std::string& host, int& port) {
  char h[NI_MAXHOST], s[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, h, sizeof h, s, sizeof s,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  host = h;
  port = std::atoi(s);
  return true;
}

}  // namespace

int find_connection_socket(int local_port, const std::string& remote_addr, int remote_port) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int found = -1;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != 0 || fd == dirfd(d)) continue;
    struct stat st;
    if (fstat(int(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    std::string host;
    int port = -1;
    if (getsockname(int(fd), reinterpret_cast<sockaddr*>(&a), &len) != 0 ||
        !numeric(a, len, host, port) || port != local_port)
      continue;
    len = sizeof a;
    if (getpeername(int(fd), reinterpret_cast<sockaddr*>(&a), &len) != 0 ||
        !numeric(a, len, host, port) || port != remote_port || host != remote_addr)
      continue;
    found = int(fd);
    break;
  }
  closedir(d);
  return found;
}

bool peer_closed(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  if (poll(&p, 1, 0) < 0) return false;  // EINTR and the like: look again next time
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace loom::serve
