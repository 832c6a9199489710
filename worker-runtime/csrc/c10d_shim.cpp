// A C ABI over the parts of libtorch's c10d that a Rust worker needs: a
// TCPStore client, the store prefixes PyTorch's default process group uses,
// a ProcessGroupGloo, and blocking collectives on at::Tensor.
//
// Why C++ at all: c10d's classes are C++ only (no C API in libtorch, none in
// tch). Everything here is thin glue; policy (validation, error types,
// defaults) lives in Rust.
//
// Error contract: no C++ exception crosses this boundary. Every entry point
// catches everything and returns a non-zero wr_status with a heap-allocated
// message (freed by wr_string_free). A process must never abort because a
// peer died or a store timed out: the Rust side turns the message into a
// typed error.
//
// Tensors: tch's C_tensor* is an at::Tensor* (torch-sys's torch_api.h). The
// shim only reads these handles or copies them shallowly (sharing storage),
// so results land in the caller's tensors; it never frees them.

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gloo/common/error.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace {

// Kinds of failure, mirrored by FailureKind in src/ffi.rs.
enum Status : int32_t {
  kOk = 0,
  kStore = 1,       // c10::DistStoreError: the TCPStore (connect, get, wait)
  kNetwork = 2,     // c10::DistNetworkError, gloo::IoException: a connection
  kBackend = 3,     // c10::DistBackendError, other gloo::Exception: gloo
  kTorch = 4,       // any other c10::Error (bad argument, timeout, ...)
  kStd = 5,         // a std::exception that is not a c10::Error
  kUnknown = 6,     // anything else that was thrown
};

char* copy_string(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out != nullptr) {
    std::memcpy(out, s.data(), s.size());
    out[s.size()] = '\0';
  }
  return out;
}

// Runs `f`, translating any exception into a status and a message.
template <typename F>
int32_t guarded(char** err, F&& f) {
  try {
    f();
    return kOk;
  } catch (const c10::DistStoreError& e) {
    *err = copy_string(e.what_without_backtrace());
    return kStore;
  } catch (const c10::DistNetworkError& e) {
    *err = copy_string(e.what_without_backtrace());
    return kNetwork;
  } catch (const c10::DistBackendError& e) {
    *err = copy_string(e.what_without_backtrace());
    return kBackend;
  } catch (const gloo::IoException& e) {
    // A peer closed its connection or stopped answering (gloo's message
    // says which address).
    *err = copy_string(e.what());
    return kNetwork;
  } catch (const gloo::Exception& e) {
    *err = copy_string(e.what());
    return kBackend;
  } catch (const c10::Error& e) {
    *err = copy_string(e.what_without_backtrace());
    return kTorch;
  } catch (const std::exception& e) {
    *err = copy_string(e.what());
    return kStd;
  } catch (...) {
    *err = copy_string("unknown C++ exception");
    return kUnknown;
  }
}

c10d::ReduceOp reduce_op(int32_t op) {
  TORCH_CHECK(op >= 0 && op <= 4, "unknown reduce op code ", op);
  switch (op) {
    case 0:
      return c10d::ReduceOp::SUM;
    case 1:
      return c10d::ReduceOp::AVG;
    case 2:
      return c10d::ReduceOp::PRODUCT;
    case 3:
      return c10d::ReduceOp::MIN;
    default:
      return c10d::ReduceOp::MAX;
  }
}

}  // namespace

// One process group: the store it rendezvoused through and the gloo backend.
struct wr_group {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  std::chrono::milliseconds timeout;

  void wait(const c10::intrusive_ptr<c10d::Work>& work) const {
    work->wait(timeout);
  }
};

extern "C" {

void wr_string_free(char* s) { std::free(s); }

// Connects to the TCPStore at host:port and forms the default group's gloo
// backend. `is_master` makes this process host the store itself (PyTorch's
// behaviour for rank 0 when TORCHELASTIC_USE_AGENT_STORE is not "True").
int32_t wr_group_new(const char* host, uint16_t port, int32_t is_master,
                     int32_t rank, int32_t size, int64_t timeout_ms,
                     wr_group** out, char** err) {
  *out = nullptr;
  return guarded(err, [&] {
    const auto timeout = std::chrono::milliseconds(timeout_ms);

    // As torch/distributed/rendezvous.py's _create_c10d_store does for
    // env:// (clients always; multi-tenant server for a hosting rank 0).
    c10d::TCPStoreOptions opts;
    opts.port = port;
    opts.isServer = is_master != 0;
    opts.numWorkers = static_cast<std::size_t>(size);
    opts.waitWorkers = true;
    opts.timeout = timeout;
    opts.multiTenant = is_master != 0;
    c10::intrusive_ptr<c10d::Store> store =
        c10::make_intrusive<c10d::TCPStore>(std::string(host), opts);

    // As distributed_c10d.py does for the first (default) group: init_process_group
    // wraps the rendezvous store in PrefixStore("default_pg"),
    // _new_process_group_helper adds the group name ("0/", the first group of
    // the process), and then the device ("cpu/") for its gloo backend.
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(
        "cpu/", c10::make_intrusive<c10d::PrefixStore>(
                    "0/", c10::make_intrusive<c10d::PrefixStore>("default_pg",
                                                                 store)));

    // create_default is what Python's ProcessGroupGloo(store, rank, size,
    // timeout) uses: one device from GLOO_SOCKET_IFNAME if set, else the
    // address the host name resolves to (loopback as a fallback).
    auto options = c10d::ProcessGroupGloo::Options::create_default(timeout);
    options->group_name = "0";
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size,
                                                          options);
    *out = new wr_group{store, pg, timeout};
  });
}

void wr_group_free(wr_group* group) {
  // ~ProcessGroupGloo drains its queue and joins its threads; it does not
  // throw, but nothing may escape into Rust's drop.
  try {
    delete group;
  } catch (...) {
  }
}

int32_t wr_all_reduce(wr_group* group, at::Tensor* tensor, int32_t op,
                      char** err) {
  return guarded(err, [&] {
    std::vector<at::Tensor> tensors{*tensor};
    c10d::AllreduceOptions opts;
    opts.reduceOp = reduce_op(op);
    opts.timeout = group->timeout;
    group->wait(group->pg->allreduce(tensors, opts));
  });
}

int32_t wr_broadcast(wr_group* group, at::Tensor* tensor, int32_t root,
                     char** err) {
  return guarded(err, [&] {
    std::vector<at::Tensor> tensors{*tensor};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.rootTensor = 0;
    opts.timeout = group->timeout;
    group->wait(group->pg->broadcast(tensors, opts));
  });
}

// outputs[i] receives rank i's input; the caller allocates all `n` of them.
int32_t wr_all_gather(wr_group* group, const at::Tensor* input,
                      const at::Tensor* const* outputs, int32_t n,
                      char** err) {
  return guarded(err, [&] {
    std::vector<at::Tensor> inputs{*input};
    std::vector<std::vector<at::Tensor>> outs(1);
    outs[0].reserve(static_cast<std::size_t>(n));
    for (int32_t i = 0; i < n; ++i) {
      outs[0].push_back(*outputs[i]);
    }
    c10d::AllgatherOptions opts;
    opts.timeout = group->timeout;
    group->wait(group->pg->allgather(outs, inputs, opts));
  });
}

// output = op over ranks of inputs[this rank]; one input per rank.
int32_t wr_reduce_scatter(wr_group* group, at::Tensor* output,
                          const at::Tensor* const* inputs, int32_t n,
                          int32_t op, char** err) {
  return guarded(err, [&] {
    std::vector<at::Tensor> outs{*output};
    std::vector<std::vector<at::Tensor>> ins(1);
    ins[0].reserve(static_cast<std::size_t>(n));
    for (int32_t i = 0; i < n; ++i) {
      ins[0].push_back(*inputs[i]);
    }
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = reduce_op(op);
    opts.timeout = group->timeout;
    group->wait(group->pg->reduce_scatter(outs, ins, opts));
  });
}

int32_t wr_barrier(wr_group* group, char** err) {
  return guarded(err, [&] {
    c10d::BarrierOptions opts;
    opts.timeout = group->timeout;
    group->wait(group->pg->barrier(opts));
  });
}

}  // extern "C"
