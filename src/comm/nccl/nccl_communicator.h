// The NCCL implementation of comm::Communicator: collectives on device buffers of one GPU per
// rank, run on the communicator's own CUDA stream so they overlap the compute stream.
//
// Ordering: every *_async call first makes the communication stream wait for the work already
// queued on the compute stream (an event), so it reduces what compute produced; Work::wait()
// then makes the compute stream wait for the collective (device-side) and blocks the host until
// it is done; Work::test() polls.
//
// Point to point: NCCL has no message tags; it matches sends from one rank to another with that
// rank's receives in issue order. Sends and receives are held back and issued together, in call
// order, in one ncclGroupStart/End at the first wait() or test() on any of them (or before the
// next collective), so a ring step's send and receive progress concurrently and an exchange
// with one peer in both directions does not deadlock the stream. Tags are not matched: for each
// ordered pair of ranks, callers issue sends and receives in the same order, and a group's
// messages must not wait on messages the caller issues later (a group blocks the stream until
// all of it is matched). The ring attention and the EP all-to-all satisfy both; the pipeline
// runner's early receives do not, so its group uses the staged communicator
// (comm/staged_communicator.h: device memory over MPI with real tags), as do ranks that share
// a GPU (NCCL refuses them). docs/parallel.md, "Parallelism on the device".
//
// Bootstrap: the ncclUniqueId of rank 0 reaches the other ranks either through an existing
// communicator (MPI world: a host broadcast of 128 bytes) or through a file (rendezvous on a
// shared filesystem, no MPI needed).
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"

namespace loom::comm {

// compute_stream: the cudaStream_t the ranks' kernels run on (e.g. CudaBackend::stream());
// nullptr means the legacy default stream.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device,
                                                     void* compute_stream,
                                                     const std::string& name = "nccl");
// Rank 0 writes the id to `path` (atomically); the others poll for it up to timeout_s. Use a
// path unique to the job (a stale file from an earlier job would hand out a dead id).
std::unique_ptr<Communicator> make_nccl_communicator_file(const std::string& path, int rank,
                                                          int size, int device,
                                                          void* compute_stream,
                                                          double timeout_s = 300.0,
                                                          const std::string& name = "nccl");

}  // namespace loom::comm
