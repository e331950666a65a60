// A communicator over device memory that needs no NCCL: every buffer a collective or message
// takes is a Backend buffer (device memory on a GPU), copied to a host buffer (Backend::
// copy_d2h) before the host communicator (MPI) moves it, and back (copy_h2d) when the operation
// completes, in Work::wait() or the Work::test() that first sees it done. Everything the host
// communicator guarantees holds unchanged: message tags are MPI's, so a receive matches its
// send by tag whatever the order of issue; reductions run on the host in MPI's order.
//
// Why it exists: NCCL refuses two ranks on one GPU, so two processes sharing a GPU (the only way
// to run a multi-rank layout on a machine with one GPU) exchange through the host; and without
// NCCL (a CUDA build lacking it, or the guarded CPU backend of the tests) it is the only device
// communicator. It is slower than NCCL (every byte crosses PCIe twice, the host waits for each
// copy), never wrong.
//
// The host buffers of one operation live until it completes (its Work holds them); a send's
// device buffer may be reused as soon as send_async returns (its bytes were copied then).
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"

namespace loom {
struct Backend;
}

namespace loom::comm {

// Wraps `host` (owned) for buffers of `be`. all_reduce_f64 takes host doubles as the interface
// says and goes to `host` directly; split() wraps the host communicator's split.
std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> host,
                                                       Backend& be);
// The same over a host communicator owned elsewhere (it must outlive the result).
std::unique_ptr<Communicator> make_staged_communicator(Communicator& host, Backend& be);

}  // namespace loom::comm
