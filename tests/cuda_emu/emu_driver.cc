// A test double of the CUDA driver library: an emulated libcuda.so.1 for running the
// project's CUDA code paths (cudarc's dynamic loading, tests/python/cuda_driver.py)
// on machines without a GPU. Built by tests/cuda_emu/build.py; not shipped.
//
// What it emulates (the CUDA 12 driver API subset ndx and its tests use; exact
// exported names and C signatures of cuda.h, typedefs written here):
//   - one device (ordinal 0, compute capability 9.0, 4 SMs) and its primary
//     context, one fixed handle; cuInit must come first, and calls that use the
//     context need it current on the calling thread (else CUDA_ERROR_INVALID_CONTEXT);
//     its last cuDevicePrimaryCtxRelease_v2, or cuDevicePrimaryCtxReset_v2, frees
//     everything it owned;
//   - device memory = host memory, 256-byte aligned, with a capacity
//     (NDX_EMU_MEM_BYTES, default 1 GiB) so OOM paths can be tested; typed copies
//     and memsets check that their device range lies inside one live allocation
//     (CUDA_ERROR_INVALID_VALUE otherwise; cuMemcpy/cuMemcpyAsync, unified, do not);
//   - modules from PTX text: the `.entry` names of the image pick one of the kernel
//     libraries build.py compiled from src/cuda/kernels/*.cu with host_emulation.h
//     (ndx_emu_<module>.so, next to this library), and cuLaunchKernel runs the
//     kernel's C++ twin on the CPU, every GPU thread being a fiber (a warp's 32 lanes
//     share an OS thread; warps run in parallel on a pool of threads);
//   - streams and events: by default every stream operation executes at the call,
//     in call order. NDX_EMU_ASYNC=1 gives each stream a worker thread and a FIFO
//     so that missing synchronisation shows (see "Execution model" below);
//   - sticky errors: NDX_EMU_FAULT_KERNEL=name[:N] makes the N-th launch of a kernel
//     (1-based, default 1) fault with CUDA_ERROR_ILLEGAL_ADDRESS when its stream
//     reaches it. From then on no stream operation executes and every call on the
//     context, its streams, events, modules or memory returns 700 (destroy and free
//     calls still release, then return 700), until cuDevicePrimaryCtxReset_v2, the
//     last release of the primary context, or ndx_emu_reset();
//   - NDX_EMU_NO_STREAM_MEMOPS=1: cuStreamWriteValue* return CUDA_ERROR_NOT_SUPPORTED,
//     as on a device without stream memory operations.
//
// What it does not emulate: more than one device or context, multi-dimensional
// launches, shared memory, cooperative launches, `extra` launch parameters, cubin or
// fatbin images, graphs, memory pools, peer access, texture objects, the old 32-bit
// unsuffixed entry points (cuMemAlloc, cuMemFree, ...), and faults of real kernels:
// a kernel that dereferences a bad pointer crashes the process, and warp-divergent
// code that leaves a lane out of a warp barrier aborts it with a message. The x86-64
// fiber switch does not maintain a CET shadow stack: processes running with one
// enforced are not supported.
//
// NDX_EMU_LAUNCH_CALL_DELAY_MS: cuLaunchKernel sleeps after queueing its launch,
// before it returns, so that launches of other threads interleave with the caller's.
// NDX_EMU_EVENT_SYNC_DELAY_MS: cuEventSynchronize sleeps once the event completed,
// before it returns (and reads the sticky error), so that a waiter notices a fault of
// work enqueued after its event.
//
// Execution model with NDX_EMU_ASYNC=1 (also NDX_EMU_KERNEL_DELAY_MS: a sleep before
// each kernel executes, to prove that consumers wait):
//   - an operation runs on its stream's worker, after the operations before it; an
//     event record counts as done when the event completes, so that a stream whose
//     last operation is a completed event is idle (cuStreamQuery), as on a device;
//   - the NULL stream, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD are all the legacy
//     default stream (the per-thread stream is therefore more synchronising than a
//     real one): its operations wait for the earlier work of every blocking stream
//     (created with flags 0), and the operations of blocking streams wait for its
//     earlier work. CU_STREAM_NON_BLOCKING streams wait for nothing;
//   - synchronous copies and memsets are legacy-stream operations the call waits for;
//     cuMemFree_v2 waits for every stream, cuMemFreeAsync frees when its stream
//     reaches it;
//   - cuMemcpyHtoDAsync from a pageable source first waits for the stream's queued
//     work, then copies the source into a staging buffer at the call (the caller may
//     reuse it at once); a source in cuMemHostAlloc memory is read when the stream
//     reaches the copy, as DMA would, and the call returns at once. cuMemcpyDtoHAsync
//     writes when the stream reaches the copy; into pageable memory the call returns only
//     once the copy has run, as the driver documents, into cuMemHostAlloc memory at once.
//
// Test hooks (C linkage): ndx_emu_launch_count() counts the launches cuLaunchKernel
// accepted, ndx_emu_kernels_run() the kernels that have run, ndx_emu_copy_count() the
// copies queued on streams (cuMemcpy*Async); ndx_emu_reset() waits for the streams,
// clears the sticky error and the counters and re-reads NDX_EMU_MEM_BYTES,
// NDX_EMU_FAULT_KERNEL, NDX_EMU_KERNEL_DELAY_MS, NDX_EMU_LAUNCH_CALL_DELAY_MS and
// NDX_EMU_EVENT_SYNC_DELAY_MS. NDX_EMU_WORKERS sets how many warps run at once
// (default: the number of CPUs, at most 16); NDX_EMU_KERNELS_DIR where the kernel
// libraries are (default: this library's directory).

#include <dirent.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>  // fiber stacks announced to valgrind (no-ops otherwise)
#else
#define VALGRIND_STACK_REGISTER(lo, hi) 0u
#define VALGRIND_STACK_DEREGISTER(id) ((void)(id))
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#define NDX_EMU_API extern "C" __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void* CUcontext;
typedef void* CUstream;
typedef void* CUevent;
typedef void* CUmodule;
typedef void* CUfunction;
typedef int CUjit_option;

namespace {

enum : int {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_PTX = 218,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_NOT_SUPPORTED = 801,
};

struct ErrorText {
    int code;
    const char* name;
    const char* text;
};
// The codes this library returns, with the real driver's names and messages.
const ErrorText kErrors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {218, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
};

// ----------------------------------------------------------------------------------
// The kernel libraries. Layout shared with the wrapper build.py generates for each
// module (bump kEmuAbi on both sides when it changes).

const unsigned kEmuAbi = 1;

struct EmuEntry {
    const char* name;
    void (*call)(void* const* params);  // reads each argument from params[i]
    unsigned nparams;
    const unsigned* sizes;  // sizeof each parameter
};

struct EmuModule {
    unsigned abi;
    const char* name;
    void (*begin)(unsigned grid, unsigned block);  // host_emulation.h's ndx_emu_begin
    void (*set_thread)(unsigned block, unsigned thread);
    void (**fiber_yield)(unsigned long waits);  // the library's hook, set by the driver
    const EmuEntry* entries;
    unsigned count;
};

// ----------------------------------------------------------------------------------
// Configuration from the environment.

unsigned long long env_u64(const char* name, unsigned long long dflt) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') return dflt;
    char* end = nullptr;
    const unsigned long long x = std::strtoull(v, &end, 0);
    return (end != nullptr && *end == '\0') ? x : dflt;
}

struct Config {
    unsigned long long mem_total = 1ull << 30;
    unsigned delay_ms = 0;
    unsigned call_delay_ms = 0;
    unsigned sync_delay_ms = 0;
    std::string fault_kernel;  // empty: no fault injection
    unsigned long long fault_nth = 1;

    void read() {
        mem_total = env_u64("NDX_EMU_MEM_BYTES", 1ull << 30);
        delay_ms = (unsigned)env_u64("NDX_EMU_KERNEL_DELAY_MS", 0);
        call_delay_ms = (unsigned)env_u64("NDX_EMU_LAUNCH_CALL_DELAY_MS", 0);
        sync_delay_ms = (unsigned)env_u64("NDX_EMU_EVENT_SYNC_DELAY_MS", 0);
        fault_kernel.clear();
        fault_nth = 1;
        if (const char* f = std::getenv("NDX_EMU_FAULT_KERNEL")) {
            fault_kernel = f;
            const size_t colon = fault_kernel.find(':');
            if (colon != std::string::npos) {
                fault_nth = std::strtoull(fault_kernel.c_str() + colon + 1, nullptr, 10);
                if (fault_nth == 0) fault_nth = 1;
                fault_kernel.resize(colon);
            }
        }
    }
};

// ----------------------------------------------------------------------------------
// Streams. In synchronous mode a stream is only a handle; in asynchronous mode it
// owns a worker thread draining a FIFO of operations. `enq` counts the operations
// pushed, `done` those finished: waiting for a point of the stream is waiting for
// `done` to reach the `enq` seen then.

using Op = std::function<void()>;

struct Stream {
    unsigned flags = 0;
    bool legacy = false;
    std::mutex m;
    std::condition_variable cv;
    std::deque<Op> q;
    // Per queued op: a marker (an event's completion) counts as done before it runs,
    // under `m`, so whoever it wakes finds the stream past it, as on a real device
    // (a stream whose last operation was a completed event record is idle).
    std::deque<bool> markers;
    unsigned long long enq = 0, done = 0;
    bool stop = false;
    std::thread worker;

    void start() {
        worker = std::thread([this] { run(); });
    }
    void push(Op op, bool marker = false) {
        std::lock_guard<std::mutex> lock(m);
        q.push_back(std::move(op));
        markers.push_back(marker);
        ++enq;
        cv.notify_all();
    }
    unsigned long long position() {
        std::lock_guard<std::mutex> lock(m);
        return enq;
    }
    bool reached(unsigned long long seq) {
        std::lock_guard<std::mutex> lock(m);
        return done >= seq;
    }
    void wait_for(unsigned long long seq) {
        std::unique_lock<std::mutex> lock(m);
        cv.wait(lock, [&] { return done >= seq; });
    }
    void shutdown() {
        if (!worker.joinable()) return;
        {
            std::lock_guard<std::mutex> lock(m);
            stop = true;
            cv.notify_all();
        }
        worker.join();
    }

  private:
    void run() {
        std::unique_lock<std::mutex> lock(m);
        for (;;) {
            cv.wait(lock, [&] { return stop || !q.empty(); });
            if (q.empty()) return;  // stop, drained
            Op op = std::move(q.front());
            q.pop_front();
            const bool marker = markers.front();
            markers.pop_front();
            if (marker) {
                ++done;
                op();  // short, and takes no stream lock
                cv.notify_all();
                continue;
            }
            lock.unlock();
            op();
            op = nullptr;  // drop what it captured before reporting it done
            lock.lock();
            ++done;
            cv.notify_all();
        }
    }
};

struct Event {
    unsigned flags = 0;
    std::mutex m;
    std::condition_variable cv;
    unsigned long long recorded = 0;   // how many times cuEventRecord was called
    unsigned long long completed = 0;  // the latest recording its stream executed
    std::chrono::steady_clock::time_point when;

    void complete(unsigned long long gen) {
        std::lock_guard<std::mutex> lock(m);
        if (gen > completed) {
            completed = gen;
            when = std::chrono::steady_clock::now();
        }
        cv.notify_all();
    }
    void wait_for(unsigned long long gen) {
        std::unique_lock<std::mutex> lock(m);
        cv.wait(lock, [&] { return completed >= gen; });
    }
};

struct Module;

struct Function {
    Module* module = nullptr;
    std::string name;
    const EmuModule* lib = nullptr;
    const EmuEntry* entry = nullptr;
};

struct Module {
    const EmuModule* lib = nullptr;  // null when no kernel library matches the image
    std::map<std::string, std::vector<unsigned>> entries;  // .entry -> parameter sizes
    std::map<std::string, std::unique_ptr<Function>> functions;
};

struct Alloc {
    void* base;
    size_t size;
    bool host;  // cuMemHostAlloc / cuMemAllocHost (not counted against the capacity)
};

// ----------------------------------------------------------------------------------
// Global state, behind one mutex. Nothing waits for a stream or runs a kernel while
// holding it: stream workers take it (stream-ordered frees), so that would deadlock.

struct State {
    std::mutex mu;
    std::atomic<bool> initialized{false};
    bool async = false;  // set once, before `initialized`
    Config cfg;
    std::atomic<int> ctx_refs{0};
    std::map<CUdeviceptr, Alloc> allocs;  // by base address
    unsigned long long dev_used = 0;
    std::shared_ptr<Stream> legacy;
    std::map<void*, std::shared_ptr<Stream>> streams;
    std::map<void*, std::shared_ptr<Event>> events;
    std::map<void*, std::unique_ptr<Module>> modules;
    std::set<void*> functions;
    bool libs_loaded = false;
    std::vector<const EmuModule*> libs;
    std::map<std::string, unsigned long long> launches_by_name;  // for fault injection
};

// Never destroyed: worker threads may outlive static destruction at exit.
std::atomic<State*> g_state{nullptr};
State& S() {
    static State* s = new State();
    g_state.store(s);
    return *s;
}

std::atomic<int> g_sticky{0};  // the context's sticky error, 0 when healthy
std::atomic<unsigned long long> g_launches{0};
std::atomic<unsigned long long> g_kernels_run{0};
std::atomic<unsigned long long> g_async_copies{0};
char g_context_token;  // the primary context's handle is its address
CUcontext const kContext = &g_context_token;
thread_local CUcontext t_current = nullptr;

using Lock = std::unique_lock<std::mutex>;

// ----------------------------------------------------------------------------------
// Kernel execution. Every GPU thread is a fiber: a warp's 32 lanes run on one OS
// thread, switching at its barriers (host_emulation.h's warp intrinsics, made
// fiber-aware by the fiber_sync.h build.py generates), since waking 32 OS threads per
// barrier cost ~60 us where a fiber switch costs nanoseconds. A pool of W worker
// threads (NDX_EMU_WORKERS, default the CPU count, at most 16) runs warps w, w + W,
// w + 2W, ... in parallel: warps are independent (no shared memory, no
// __syncthreads), so a whole block need not run at once. Launches are serialised:
// host_emulation.h keeps gridDim and the warps in globals of each kernel library.

struct LaunchJob {
    const EmuModule* lib = nullptr;
    void (*call)(void* const*) = nullptr;
    void* const* params = nullptr;
    unsigned grid = 0, block = 0;
};

#if defined(__x86_64__)
// The context switch: saves the callee-saved registers on the current stack, stores
// its pointer in *save, continues on `to` (made by fiber_frame or an earlier switch).
extern "C" void emu_fiber_switch(void** save, void* to);
extern "C" void emu_fiber_start();
asm(R"(
    .text
    .p2align 4
    .hidden emu_fiber_switch
    .type emu_fiber_switch, @function
emu_fiber_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_fiber_switch, .-emu_fiber_switch

    .p2align 4
    .hidden emu_fiber_start
    .type emu_fiber_start, @function
emu_fiber_start:
    movq %r12, %rdi
    andq $-16, %rsp
    callq *%r13
    ud2
    .size emu_fiber_start, .-emu_fiber_start
)");

// A new fiber's stack: emu_fiber_switch pops r15..rbp (r12 = arg, r13 = fn) and
// returns into emu_fiber_start, which calls fn(arg).
void* fiber_frame(unsigned char* top, void (*fn)(void*), void* arg) {
    uintptr_t* sp = reinterpret_cast<uintptr_t*>(top);
    *--sp = 0;
    *--sp = (uintptr_t)&emu_fiber_start;
    *--sp = 0;                // rbp
    *--sp = 0;                // rbx
    *--sp = (uintptr_t)arg;   // r12
    *--sp = (uintptr_t)fn;    // r13
    *--sp = 0;                // r14
    *--sp = 0;                // r15
    return sp;
}
#endif  // elsewhere: ucontext, portable but slower (a signal-mask syscall per switch)

// The fibers of one worker thread: 32 stacks with guard pages, reused by every warp.
class WarpFibers {
  public:
    WarpFibers() {
        const size_t page = (size_t)sysconf(_SC_PAGESIZE);
        slot_ = kStack + page;
        mem_ = static_cast<unsigned char*>(
            mmap(nullptr, slot_ * 32, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
        if (mem_ == MAP_FAILED) {
            std::fprintf(stderr, "ndx cuda emulation: cannot map fiber stacks\n");
            std::abort();
        }
        for (unsigned i = 0; i < 32; ++i) {
            mprotect(mem_ + i * slot_, page, PROT_NONE);  // an overflow faults
            valgrind_ids_[i] = VALGRIND_STACK_REGISTER(mem_ + i * slot_ + page, mem_ + (i + 1) * slot_);
        }
    }
    ~WarpFibers() {
        for (unsigned i = 0; i < 32; ++i) VALGRIND_STACK_DEREGISTER(valgrind_ids_[i]);
        munmap(mem_, slot_ * 32);
    }
    WarpFibers(const WarpFibers&) = delete;
    WarpFibers& operator=(const WarpFibers&) = delete;

    // Runs warp `w` of the launch: its 32 lanes, round robin, each until it finishes
    // or waits at a barrier.
    void run_warp(const LaunchJob& job, unsigned long long w) {
        job_ = &job;
        const unsigned warps_per_block = job.block / 32;
        const unsigned block = (unsigned)(w / warps_per_block), first = (unsigned)(w % warps_per_block) * 32;
        for (unsigned lane = 0; lane < 32; ++lane) {
            finished_[lane] = false;
            // Staggered tops: stacks a power of two apart would share cache sets.
            unsigned char* top = mem_ + (lane + 1) * slot_ - lane * 320;
#if defined(__x86_64__)
            lane_sp_[lane] = fiber_frame(top, &WarpFibers::entry, this);
#else
            getcontext(&lane_uc_[lane]);
            lane_uc_[lane].uc_stack.ss_sp = top - kStack;
            lane_uc_[lane].uc_stack.ss_size = kStack;
            lane_uc_[lane].uc_link = nullptr;
            makecontext(&lane_uc_[lane], reinterpret_cast<void (*)()>(&WarpFibers::uc_entry), 0);
#endif
        }
        for (unsigned alive = 32; alive > 0;) {
            for (unsigned lane = 0; lane < 32; ++lane) {
                if (finished_[lane]) continue;
                current_ = lane;
                job.lib->set_thread(block, first + lane);  // threadIdx is per OS thread
#if defined(__x86_64__)
                emu_fiber_switch(&sched_sp_, lane_sp_[lane]);
#else
                swapcontext(&sched_uc_, &lane_uc_[lane]);
#endif
                alive -= finished_[lane];
            }
        }
    }

    // Back to the scheduler; the lane resumes here on its next turn.
    void yield() {
#if defined(__x86_64__)
        emu_fiber_switch(&lane_sp_[current_], sched_sp_);
#else
        swapcontext(&lane_uc_[current_], &sched_uc_);
#endif
    }

    static thread_local WarpFibers* current;

  private:
    static void entry(void* self) {
        WarpFibers* f = static_cast<WarpFibers*>(self);
        f->job_->call(f->job_->params);
        f->finished_[f->current_] = true;
        f->yield();  // never resumed
    }
#if !defined(__x86_64__)
    static void uc_entry() { entry(current); }
    ucontext_t sched_uc_, lane_uc_[32];
#endif

    static constexpr size_t kStack = 256 << 10;
    unsigned char* mem_ = nullptr;
    size_t slot_ = 0;
    unsigned valgrind_ids_[32] = {};
    const LaunchJob* job_ = nullptr;
    void* sched_sp_ = nullptr;
    void* lane_sp_[32] = {};
    bool finished_[32] = {};
    unsigned current_ = 0;
};
thread_local WarpFibers* WarpFibers::current = nullptr;

// ndx_emu_fiber_yield of the kernel libraries.
void fiber_yield(unsigned long waits) {
    // A barrier completes within two rounds of the warp's lanes; a million means a
    // lane never arrives (warp-divergent code): a GPU would hang, abort instead.
    if (waits > (1ul << 20)) {
        std::fprintf(stderr, "ndx cuda emulation: warp deadlock: a lane waits at a warp barrier the others "
                             "never reach (warp-divergent code)\n");
        std::abort();
    }
    WarpFibers::current->yield();
}

class WarpPool {
  public:
    void run(const LaunchJob& job) {
        const unsigned long long nwarps = (unsigned long long)job.grid * job.block / 32;
        Lock lock(m_);
        if (workers_ == 0) start_locked();
        job_ = job;
        active_ = (unsigned)std::min<unsigned long long>(workers_, nwarps);
        pending_ = workers_;
        ++generation_;
        start_cv_.notify_all();
        done_cv_.wait(lock, [&] { return pending_ == 0; });
    }

    // At exit: ends the workers (threads alive at exit look like leaks to valgrind).
    void shutdown() {
        {
            Lock lock(m_);
            stop_ = true;
            start_cv_.notify_all();
        }
        for (std::thread& t : threads_) t.join();
        threads_.clear();
    }

  private:
    void start_locked() {
        unsigned n = (unsigned)env_u64("NDX_EMU_WORKERS", 0);
        if (n == 0) n = std::thread::hardware_concurrency();
        workers_ = std::max(1u, std::min(n, 16u));
        for (unsigned i = 0; i < workers_; ++i) threads_.emplace_back([this, i] { work(i); });
    }

    void work(unsigned i) {
        WarpFibers fibers;  // lives as long as the (detached) thread
        WarpFibers::current = &fibers;
        unsigned long long seen = 0;
        for (;;) {
            LaunchJob job;
            unsigned active;
            {
                Lock lock(m_);
                start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
                if (generation_ == seen) return;  // stopping, no launch in flight
                seen = generation_;
                job = job_;
                active = active_;
            }
            if (i < active) {
                const unsigned long long nwarps = (unsigned long long)job.grid * job.block / 32;
                for (unsigned long long w = i; w < nwarps; w += active) fibers.run_warp(job, w);
            }
            Lock lock(m_);
            if (--pending_ == 0) done_cv_.notify_all();
        }
    }

    std::mutex m_;
    std::condition_variable start_cv_, done_cv_;
    LaunchJob job_;
    std::vector<std::thread> threads_;
    bool stop_ = false;
    unsigned workers_ = 0, active_ = 0, pending_ = 0;
    unsigned long long generation_ = 0;
};

std::mutex g_launch_mu;
WarpPool* g_pool = nullptr;  // under g_launch_mu; never deleted (see shutdown_at_exit)

void run_kernel(const LaunchJob& job) {
    std::lock_guard<std::mutex> lock(g_launch_mu);
    if (g_pool == nullptr) g_pool = new WarpPool();
    WarpPool* pool = g_pool;
    *job.lib->fiber_yield = &fiber_yield;
    job.lib->begin(job.grid, job.block);
    pool->run(job);
    job.lib->begin(0, 0);  // frees the launch's warp barriers
}

// ----------------------------------------------------------------------------------
// Submitting stream operations.

// The operations `op` must wait for before it runs on `s` (asynchronous mode): the
// legacy stream waits for the blocking streams and they wait for it. Needs S().mu.
std::vector<std::pair<std::shared_ptr<Stream>, unsigned long long>> implicit_deps_locked(
    const std::shared_ptr<Stream>& s) {
    State& st = S();
    std::vector<std::pair<std::shared_ptr<Stream>, unsigned long long>> deps;
    if (s->legacy) {
        for (auto& kv : st.streams) {
            if (kv.second->flags == 0) deps.emplace_back(kv.second, kv.second->position());
        }
    } else if (s->flags == 0) {
        deps.emplace_back(st.legacy, st.legacy->position());
    }
    return deps;
}

// Runs `op` now (synchronous mode) or queues it on `s`. Call without S().mu.
// Queues `op` on `s` (runs it at once without NDX_EMU_ASYNC) and returns the
// position `s->wait_for` waits for to see it done (0 where it already ran).
// A `marker` op (an event's completion) counts as done before it runs (see Stream).
unsigned long long submit(const std::shared_ptr<Stream>& s, Op op, bool marker = false) {
    State& st = S();
    if (!st.async) {
        op();
        return 0;
    }
    Lock lock(st.mu);  // the dependency snapshot and the push are one step
    auto deps = implicit_deps_locked(s);
    if (!deps.empty()) {
        s->push([deps] {
            for (auto& d : deps) d.first->wait_for(d.second);
        });
    }
    s->push(std::move(op), marker);
    return s->position();
}

// Waits until `s` has executed what was submitted to it so far (for the legacy
// stream: also the earlier work of the blocking streams). Call without S().mu.
void wait_stream(const std::shared_ptr<Stream>& s) {
    State& st = S();
    if (!st.async) return;
    std::vector<std::pair<std::shared_ptr<Stream>, unsigned long long>> points;
    {
        Lock lock(st.mu);
        if (s->legacy) points = implicit_deps_locked(s);
        points.emplace_back(s, s->position());
    }
    for (auto& p : points) p.first->wait_for(p.second);
}

bool stream_idle(const std::shared_ptr<Stream>& s) {
    State& st = S();
    if (!st.async) return true;
    std::vector<std::pair<std::shared_ptr<Stream>, unsigned long long>> points;
    {
        Lock lock(st.mu);
        if (s->legacy) points = implicit_deps_locked(s);
        points.emplace_back(s, s->position());
    }
    for (auto& p : points) {
        if (!p.first->reached(p.second)) return false;
    }
    return true;
}

void wait_all_streams() {
    State& st = S();
    if (!st.async) return;
    std::vector<std::pair<std::shared_ptr<Stream>, unsigned long long>> points;
    {
        Lock lock(st.mu);
        points.emplace_back(st.legacy, st.legacy->position());
        for (auto& kv : st.streams) points.emplace_back(kv.second, kv.second->position());
    }
    for (auto& p : points) p.first->wait_for(p.second);
}

// A synchronous operation: on the legacy stream, and the call waits for it.
CUresult run_sync(Op op) {
    State& st = S();
    std::shared_ptr<Stream> legacy;
    {
        Lock lock(st.mu);
        legacy = st.legacy;
    }
    submit(legacy, std::move(op));
    wait_stream(legacy);
    return g_sticky.load();
}

// ----------------------------------------------------------------------------------
// Checks shared by the entry points.

CUresult check_init() {
    return S().initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

// Entry points that use the current context: initialised, a live context current on
// this thread, no sticky error.
CUresult check_ctx() {
    State& st = S();
    if (!st.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (t_current != kContext || st.ctx_refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
    return g_sticky.load();
}

// Entry points on handles (streams, events, modules): initialised, no sticky error.
CUresult check_live() {
    State& st = S();
    if (!st.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    return g_sticky.load();
}

// The stream of a handle (NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD: the legacy
// stream), or null. Needs S().mu.
std::shared_ptr<Stream> find_stream_locked(CUstream h) {
    State& st = S();
    const uintptr_t v = (uintptr_t)h;
    if (v == 0 || v == 1 || v == 2) return st.legacy;
    auto it = st.streams.find(h);
    return it == st.streams.end() ? nullptr : it->second;
}

// The allocation holding [p, p + n), device or pinned host, or null. Needs S().mu.
const Alloc* find_alloc_locked(CUdeviceptr p, size_t n) {
    State& st = S();
    auto it = st.allocs.upper_bound(p);
    if (it == st.allocs.begin()) return nullptr;
    --it;
    const CUdeviceptr base = it->first;
    if (p - base > it->second.size || n > it->second.size - (p - base)) return nullptr;
    return &it->second;
}

bool range_ok(CUdeviceptr p, size_t n) {
    Lock lock(S().mu);
    return find_alloc_locked(p, n) != nullptr;
}

bool in_pinned_host(const void* p, size_t n) {
    Lock lock(S().mu);
    const Alloc* a = find_alloc_locked((CUdeviceptr)(uintptr_t)p, n);
    return a != nullptr && a->host;
}

void* to_host(CUdeviceptr p) {
    return reinterpret_cast<void*>((uintptr_t)p);
}

// ----------------------------------------------------------------------------------
// Kernel libraries and PTX.

std::string library_dir() {
    if (const char* d = std::getenv("NDX_EMU_KERNELS_DIR")) return d;
    Dl_info info;
    if (dladdr(reinterpret_cast<void*>(&library_dir), &info) == 0 || info.dli_fname == nullptr) return ".";
    std::string path = info.dli_fname;
    const size_t slash = path.rfind('/');
    return slash == std::string::npos ? "." : path.substr(0, slash);
}

// Loads every ndx_emu_*.so of the library directory once. Needs S().mu.
void load_libs_locked() {
    State& st = S();
    if (st.libs_loaded) return;
    st.libs_loaded = true;
    const std::string dir = library_dir();
    std::vector<std::string> names;
    if (DIR* d = opendir(dir.c_str())) {
        while (dirent* e = readdir(d)) {
            const std::string n = e->d_name;
            if (n.size() > 11 && n.compare(0, 8, "ndx_emu_") == 0 && n.compare(n.size() - 3, 3, ".so") == 0) {
                names.push_back(n);
            }
        }
        closedir(d);
    }
    std::sort(names.begin(), names.end());
    for (const std::string& n : names) {
        const std::string path = dir + "/" + n;
        // RTLD_LOCAL: each module keeps its own helpers and host_emulation.h globals.
        void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (h == nullptr) {
            std::fprintf(stderr, "ndx cuda emulation: cannot load %s: %s\n", path.c_str(), dlerror());
            continue;
        }
        auto* m = static_cast<const EmuModule*>(dlsym(h, "ndx_emu_module"));
        if (m == nullptr || m->abi != kEmuAbi) {
            std::fprintf(stderr, "ndx cuda emulation: %s is not a kernel library of ABI %u (rebuild it)\n",
                         path.c_str(), kEmuAbi);
            dlclose(h);
            continue;
        }
        st.libs.push_back(m);  // never unloaded: launches may hold its functions
    }
    if (st.libs.empty()) {
        std::fprintf(stderr, "ndx cuda emulation: no kernel library (ndx_emu_*.so) in %s\n", dir.c_str());
    }
}

bool is_ident(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '$';
}

unsigned ptx_type_size(const std::string& t) {
    if (t == ".u8" || t == ".s8" || t == ".b8") return 1;
    if (t == ".u16" || t == ".s16" || t == ".b16" || t == ".f16") return 2;
    if (t == ".u32" || t == ".s32" || t == ".b32" || t == ".f32") return 4;
    if (t == ".u64" || t == ".s64" || t == ".b64" || t == ".f64") return 8;
    return 0;
}

// The size of one `.param` declaration (`.param .u64 x`, `.param .align 8 .b8 x[200]`,
// with optional `.ptr` state spaces); 0 when it is not understood.
unsigned ptx_param_size(const std::string& decl) {
    unsigned size = 0, count = 1;
    size_t i = 0;
    while (i < decl.size()) {
        if (decl[i] == ' ' || decl[i] == '\t' || decl[i] == '\n' || decl[i] == '\r') {
            ++i;
            continue;
        }
        size_t j = i;
        while (j < decl.size() && decl[j] != ' ' && decl[j] != '\t' && decl[j] != '\n' && decl[j] != '\r') ++j;
        const std::string tok = decl.substr(i, j - i);
        if (tok[0] == '.') {
            if (const unsigned s = ptx_type_size(tok)) size = s;
        } else if (const size_t br = tok.find('['); br != std::string::npos) {
            count = (unsigned)std::strtoul(tok.c_str() + br + 1, nullptr, 10);
        }
        i = j;
    }
    return size * count;
}

// Every `.entry NAME(params)` of PTX text, with its parameter sizes.
std::map<std::string, std::vector<unsigned>> ptx_entries(const char* text) {
    std::map<std::string, std::vector<unsigned>> out;
    const char* p = text;
    while ((p = std::strstr(p, ".entry")) != nullptr) {
        const bool starts = p == text || !is_ident(p[-1]);
        p += 6;
        if (!starts || !(*p == ' ' || *p == '\t')) continue;
        while (*p == ' ' || *p == '\t') ++p;
        const char* name = p;
        while (is_ident(*p)) ++p;
        std::string n(name, p);
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') ++p;
        if (n.empty() || *p != '(') continue;
        const char* close = std::strchr(p, ')');
        if (close == nullptr) break;
        std::vector<unsigned> sizes;
        std::string list(p + 1, close);
        size_t start = 0;
        while (start <= list.size()) {
            size_t comma = list.find(',', start);
            if (comma == std::string::npos) comma = list.size();
            const std::string decl = list.substr(start, comma - start);
            if (decl.find(".param") != std::string::npos) sizes.push_back(ptx_param_size(decl));
            start = comma + 1;
        }
        out[n] = std::move(sizes);
        p = close;
    }
    return out;
}

const EmuEntry* find_entry(const EmuModule* lib, const std::string& name) {
    for (unsigned i = 0; i < lib->count; ++i) {
        if (name == lib->entries[i].name) return &lib->entries[i];
    }
    return nullptr;
}

// JIT log options of cuModuleLoadDataEx: where to write, and the sizes written back.
struct JitLogs {
    char* info = nullptr;
    char* error = nullptr;
    size_t info_size = 0, error_size = 0;
    void** values = nullptr;
    int info_size_index = -1, error_size_index = -1;

    static void put(char* buf, size_t size, const std::string& s, void** values, int index) {
        if (buf == nullptr || size == 0) return;
        const size_t n = std::min(size - 1, s.size());
        std::memcpy(buf, s.data(), n);
        buf[n] = '\0';
        if (index >= 0) values[index] = reinterpret_cast<void*>((uintptr_t)(n + 1));
    }
    void info_log(const std::string& s) const { put(info, info_size, s, values, info_size_index); }
    void error_log(const std::string& s) const { put(error, error_size, s, values, error_size_index); }
};

CUresult load_module(CUmodule* out, const void* image, const JitLogs& logs) {
    if (out == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_ctx()) return r;
    const char* text = static_cast<const char*>(image);
    const unsigned char* b = static_cast<const unsigned char*>(image);
    if ((b[0] == 0x7f && b[1] == 'E' && b[2] == 'L' && b[3] == 'F') ||
        (b[0] == 0x50 && b[1] == 0xed && b[2] == 0x55 && b[3] == 0xba)) {
        logs.error_log("ndx cuda emulation: cubin and fatbin images are not supported, only PTX text");
        return CUDA_ERROR_INVALID_IMAGE;
    }
    if (std::strstr(text, ".version") == nullptr) {
        logs.error_log("ndx cuda emulation: not PTX text (no .version directive)");
        return CUDA_ERROR_INVALID_PTX;
    }
    auto m = std::make_unique<Module>();
    m->entries = ptx_entries(text);
    State& st = S();
    Lock lock(st.mu);
    load_libs_locked();
    // The kernel library that defines the most of the image's entries.
    size_t best = 0;
    for (const EmuModule* lib : st.libs) {
        size_t n = 0;
        for (auto& e : m->entries) n += find_entry(lib, e.first) != nullptr;
        if (n > best) {
            best = n;
            m->lib = lib;
        }
    }
    logs.info_log(m->lib ? std::string("ndx cuda emulation: module ") + m->lib->name
                         : std::string("ndx cuda emulation: no emulated kernel in this module"));
    void* h = m.get();
    st.modules[h] = std::move(m);
    *out = h;
    return CUDA_SUCCESS;
}

// Releases what a context owned (the primary context's last release, or its reset):
// waits for the streams, then frees memory, streams, events and modules.
void destroy_context_resources() {
    wait_all_streams();
    State& st = S();
    std::map<CUdeviceptr, Alloc> allocs;
    std::map<void*, std::shared_ptr<Stream>> streams;
    {
        Lock lock(st.mu);
        allocs.swap(st.allocs);
        streams.swap(st.streams);
        st.events.clear();
        st.modules.clear();
        st.functions.clear();
        st.dev_used = 0;
        g_sticky = 0;
    }
    for (auto& kv : streams) kv.second->shutdown();
    for (auto& kv : allocs) std::free(kv.second.base);
}

CUresult alloc_memory(CUdeviceptr* dptr, size_t bytes, bool host) {
    if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    const size_t rounded = (bytes + 255) & ~(size_t)255;
    if (rounded < bytes) return CUDA_ERROR_OUT_OF_MEMORY;
    State& st = S();
    Lock lock(st.mu);
    if (!host && (rounded > st.cfg.mem_total || st.dev_used > st.cfg.mem_total - rounded)) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    void* p = std::aligned_alloc(256, rounded);
    if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
    const CUdeviceptr d = (CUdeviceptr)(uintptr_t)p;
    st.allocs[d] = Alloc{p, bytes, host};
    if (!host) st.dev_used += rounded;
    *dptr = d;
    return CUDA_SUCCESS;
}

// Removes a device allocation from the books; the caller frees `base` (now, or when
// its stream reaches a cuMemFreeAsync). Needs S().mu.
CUresult release_locked(CUdeviceptr d, bool host, void** base) {
    State& st = S();
    auto it = st.allocs.find(d);
    if (it == st.allocs.end() || it->second.host != host) return CUDA_ERROR_INVALID_VALUE;
    *base = it->second.base;
    if (!host) st.dev_used -= (it->second.size + 255) & ~(size_t)255;
    st.allocs.erase(it);
    return CUDA_SUCCESS;
}

// ----------------------------------------------------------------------------------
// Copies and memsets (the entry points below share these).

enum CopyKind { HTOD, DTOH, DTOD, ANY };

CUresult copy_bytes(CopyKind kind, void* dst, const void* src, size_t n, CUstream hstream, bool async) {
    if (CUresult r = check_ctx()) return r;
    if (n == 0) return CUDA_SUCCESS;
    if (dst == nullptr || src == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if ((kind == HTOD || kind == DTOD) && !range_ok((CUdeviceptr)(uintptr_t)dst, n)) return CUDA_ERROR_INVALID_VALUE;
    if ((kind == DTOH || kind == DTOD) && !range_ok((CUdeviceptr)(uintptr_t)src, n)) return CUDA_ERROR_INVALID_VALUE;
    if (!async) {
        return run_sync([=] {
            if (!g_sticky) std::memmove(dst, src, n);
        });
    }
    std::shared_ptr<Stream> s;
    {
        Lock lock(S().mu);
        s = find_stream_locked(hstream);
    }
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    g_async_copies++;
    if (S().async && kind == HTOD && !in_pinned_host(src, n)) {
        // A pageable source: the stream is synchronised first and the source staged
        // at the call, as the driver API documents ("API synchronization behavior").
        wait_stream(s);
        auto staged = std::make_shared<std::vector<unsigned char>>(
            static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + n);
        submit(s, [=] {
            if (!g_sticky) std::memcpy(dst, staged->data(), n);
        });
    } else {
        const unsigned long long at = submit(s, [=] {
            if (!g_sticky) std::memmove(dst, src, n);
        });
        // Into pageable memory the call returns once the copy has run, after the work
        // queued before it (and not after what other threads queue meanwhile).
        if (kind == DTOH && !in_pinned_host(dst, n)) s->wait_for(at);
    }
    return CUDA_SUCCESS;
}

CUresult fill(CUdeviceptr d, unsigned value, size_t count, unsigned width, CUstream hstream, bool async) {
    if (CUresult r = check_ctx()) return r;
    if (count == 0) return CUDA_SUCCESS;
    if (d % width != 0 || count > SIZE_MAX / width || !range_ok(d, count * width)) return CUDA_ERROR_INVALID_VALUE;
    Op op = [=] {
        if (g_sticky) return;
        if (width == 1) {
            std::memset(to_host(d), (int)(value & 0xff), count);
        } else {
            uint32_t* p = static_cast<uint32_t*>(to_host(d));
            for (size_t i = 0; i < count; ++i) p[i] = value;
        }
    };
    if (!async) return run_sync(std::move(op));
    std::shared_ptr<Stream> s;
    {
        Lock lock(S().mu);
        s = find_stream_locked(hstream);
    }
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    submit(s, std::move(op));
    return CUDA_SUCCESS;
}

template <class T>
CUresult write_value(CUstream hstream, CUdeviceptr addr, T value, unsigned flags) {
    if (CUresult r = check_live()) return r;
    // NDX_EMU_NO_STREAM_MEMOPS=1: a device without stream memory operations.
    const char* no_memops = std::getenv("NDX_EMU_NO_STREAM_MEMOPS");
    if (no_memops != nullptr && std::strcmp(no_memops, "1") == 0) return CUDA_ERROR_NOT_SUPPORTED;
    if (flags > 1 || addr % sizeof(T) != 0 || !range_ok(addr, sizeof(T))) return CUDA_ERROR_INVALID_VALUE;
    std::shared_ptr<Stream> s;
    {
        Lock lock(S().mu);
        s = find_stream_locked(hstream);
    }
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    submit(s, [=] {
        if (!g_sticky) __atomic_store_n(static_cast<T*>(to_host(addr)), value, __ATOMIC_SEQ_CST);
    });
    return CUDA_SUCCESS;
}

// At exit (or unload): drains the streams and ends every worker thread, so that a
// leak checker finds no thread alive. The kernel pool is left alone if a launch is
// in flight on another thread racing the exit.
struct ShutdownAtExit {
    ~ShutdownAtExit() {
        // A library only probed (opened and closed again, as loaders that look for
        // libcuda do) never made its state: nothing to drain, nothing to allocate.
        if (g_state.load() == nullptr) return;
        State& st = S();
        if (st.initialized && st.async) {
            std::vector<std::shared_ptr<Stream>> streams;
            {
                Lock lock(st.mu);
                for (auto& kv : st.streams) streams.push_back(kv.second);
            }
            for (auto& s : streams) s->shutdown();
            st.legacy->shutdown();
        }
        std::unique_lock<std::mutex> lock(g_launch_mu, std::try_to_lock);
        if (lock.owns_lock() && g_pool != nullptr) g_pool->shutdown();
    }
} g_shutdown_at_exit;

}  // namespace

// ==================================================================================
// The driver API.

NDX_EMU_API CUresult cuGetErrorName(CUresult error, const char** pStr) {
    if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
    for (const ErrorText& e : kErrors) {
        if (e.code == error) {
            *pStr = e.name;
            return CUDA_SUCCESS;
        }
    }
    *pStr = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
}

NDX_EMU_API CUresult cuGetErrorString(CUresult error, const char** pStr) {
    if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
    for (const ErrorText& e : kErrors) {
        if (e.code == error) {
            *pStr = e.text;
            return CUDA_SUCCESS;
        }
    }
    *pStr = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
}

NDX_EMU_API CUresult cuInit(unsigned int flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    State& st = S();
    Lock lock(st.mu);
    if (!st.initialized) {
        st.cfg.read();
        st.async = std::getenv("NDX_EMU_ASYNC") != nullptr && std::strcmp(std::getenv("NDX_EMU_ASYNC"), "1") == 0;
        st.legacy = std::make_shared<Stream>();
        st.legacy->legacy = true;
        if (st.async) st.legacy->start();  // never stopped: lives as long as the process
        st.initialized = true;
    }
    return CUDA_SUCCESS;
}

NDX_EMU_API CUresult cuDriverGetVersion(int* driverVersion) {
    if (driverVersion == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = 12080;
    return CUDA_SUCCESS;
}

// ---------------------------------------------------------------------------- device

NDX_EMU_API CUresult cuDeviceGetCount(int* count) {
    if (CUresult r = check_init()) return r;
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *count = 1;
    return CUDA_SUCCESS;
}

NDX_EMU_API CUresult cuDeviceGet(CUdevice* device, int ordinal) {
    if (CUresult r = check_init()) return r;
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
    *device = 0;
    return CUDA_SUCCESS;
}

NDX_EMU_API CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
    if (CUresult r = check_init()) return r;
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    std::snprintf(name, (size_t)len, "%s", "ndx emulated GPU");
    return CUDA_SUCCESS;
}

NDX_EMU_API CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
    if (CUresult r = check_init()) return r;
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Lock lock(S().mu);
    *bytes = S().cfg.mem_total;
    return CUDA_SUCCESS;
}

NDX_EMU_API CUresult cuDeviceGetAttribute(int* pi, int attrib, CUdevice dev) {
    if (CUresult r = check_init()) return r;
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
    switch (attrib) {
        case 1: *pi = 1024; break;        // MAX_THREADS_PER_BLOCK
        case 2: case 3: *pi = 1024; break;  // MAX_BLOCK_DIM_X, _Y
        case 4: *pi = 64; break;          // MAX_BLOCK_DIM_Z
        case 5: *pi = 2147483647; break;  // MAX_GRID_DIM_X
        case 6: case 7: *pi = 65535; break;
        case 8: *pi = 49152; break;       // MAX_SHARED_MEMORY_PER_BLOCK
        case 9: *pi = 65536; break;       // TOTAL_CONSTANT_MEMORY
        case 10: *pi = 32; break;         // WARP_SIZE
        case 12: *pi = 65536; break;      // MAX_REGISTERS_PER_BLOCK
        case 13: *pi = 1000000; break;    // CLOCK_RATE (kHz)
        case 16: *pi = 4; break;          // MULTIPROCESSOR_COUNT
        case 39: *pi = 2048; break;       // MAX_THREADS_PER_MULTIPROCESSOR
        case 75: *pi = 9; break;          // COMPUTE_CAPABILITY_MAJOR
        case 76: *pi = 0; break;          // COMPUTE_CAPABILITY_MINOR
        default: *pi = 1; break;          // every capability flag supported
    }
    return CUDA_SUCCESS;
}

// --------------------------------------------------------------------------- context

NDX_EMU_API CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
    if (CUresult r = check_init()) return r;
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Lock lock(S().mu);
    S().ctx_refs++;
    *pctx = kContext;
    return CUDA_SUCCESS;
}

NDX_EMU_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    if (CUresult r = check_init()) return r;
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    bool last;
    {
        Lock lock(S().mu);
        if (S().ctx_refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
        last = --S().ctx_refs == 0;
    }
    if (last) destroy_context_resources();  // as the real driver destroys the context
    return CUDA_SUCCESS;
}

NDX_EMU_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    if (CUresult r = check_init()) return r;
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    destroy_context_resources();  // also the way out of a sticky error
    return CUDA_SUCCESS;
}

NDX_EMU_API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
    if (CUresult r = check_init()) return r;
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Lock lock(S().mu);
    *flags = 0;
    *active = S().ctx_refs > 0;
    return CUDA_SUCCESS;
}

NDX_EMU_API CUresult cuCtxSetCurrent(CUcontext ctx) {
    if (CUresult r = check_init()) return r;
    if (ctx != nullptr && ctx != kContext) return CUDA_ERROR_INVALID_CONTEXT;
    t_current = ctx;
    return CUDA_SUCCESS;
}

NDX_EMU_API CUresult cuCtxGetCurrent(CUcontext* pctx) {
    if (CUresult r = check_init()) return r;
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *pctx = t_current;
    return CUDA_SUCCESS;
}

NDX_EMU_API CUresult cuCtxGetDevice(CUdevice* device) {
    if (CUresult r = check_init()) return r;
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (t_current != kContext) return CUDA_ERROR_INVALID_CONTEXT;
    *device = 0;
    return CUDA_SUCCESS;
}

NDX_EMU_API CUresult cuCtxSynchronize(void) {
    if (CUresult r = check_ctx()) return r;
    wait_all_streams();
    return g_sticky.load();
}

// ---------------------------------------------------------------------------- memory

NDX_EMU_API CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
    if (CUresult r = check_ctx()) return r;
    return alloc_memory(dptr, bytesize, false);
}

NDX_EMU_API CUresult cuMemFree_v2(CUdeviceptr dptr) {
    if (CUresult r = check_init()) return r;
    if (dptr == 0) return CUDA_SUCCESS;  // freeing NULL is a no-op, as in the real driver
    wait_all_streams();  // a synchronous free waits for the work that may use it
    void* base = nullptr;
    {
        Lock lock(S().mu);
        if (CUresult r = release_locked(dptr, false, &base)) return r;
    }
    std::free(base);
    return g_sticky.load();
}

NDX_EMU_API CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
    if (CUresult r = check_ctx()) return r;
    {
        Lock lock(S().mu);
        if (!find_stream_locked(hStream)) return CUDA_ERROR_INVALID_HANDLE;
    }
    return alloc_memory(dptr, bytesize, false);
}

NDX_EMU_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
    if (CUresult r = check_init()) return r;
    std::shared_ptr<Stream> s;
    void* base = nullptr;
    {
        Lock lock(S().mu);
        s = find_stream_locked(hStream);
        if (!s) return CUDA_ERROR_INVALID_HANDLE;
        if (CUresult r = release_locked(dptr, false, &base)) return r;
    }
    submit(s, [base] { std::free(base); });  // stream-ordered: earlier work may use it
    return g_sticky.load();
}

NDX_EMU_API CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
    if (CUresult r = check_ctx()) return r;
    if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Lock lock(S().mu);
    *total = S().cfg.mem_total;
    *free = S().cfg.mem_total > S().dev_used ? S().cfg.mem_total - S().dev_used : 0;
    return CUDA_SUCCESS;
}

NDX_EMU_API CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int flags) {
    if (CUresult r = check_ctx()) return r;
    if (pp == nullptr || (flags & ~7u) != 0) return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr d = 0;
    if (CUresult r = alloc_memory(&d, bytesize, true)) return r;
    *pp = to_host(d);
    return CUDA_SUCCESS;
}

NDX_EMU_API CUresult cuMemAllocHost_v2(void** pp, size_t bytesize) {
    return cuMemHostAlloc(pp, bytesize, 0);
}

NDX_EMU_API CUresult cuMemFreeHost(void* p) {
    if (CUresult r = check_init()) return r;
    if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
    wait_all_streams();  // pending copies may read or write it
    void* base = nullptr;
    {
        Lock lock(S().mu);
        if (CUresult r = release_locked((CUdeviceptr)(uintptr_t)p, true, &base)) return r;
    }
    std::free(base);
    return g_sticky.load();
}

NDX_EMU_API CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p, unsigned int flags) {
    if (CUresult r = check_ctx()) return r;
    if (pdptr == nullptr || flags != 0 || !in_pinned_host(p, 1)) return CUDA_ERROR_INVALID_VALUE;
    *pdptr = (CUdeviceptr)(uintptr_t)p;  // unified addressing: the same address
    return CUDA_SUCCESS;
}

// Only CU_POINTER_ATTRIBUTE_MEMORY_TYPE (2): CU_MEMORYTYPE_HOST (1) for cuMemHostAlloc
// memory, CU_MEMORYTYPE_DEVICE (2) for device memory; memory the driver does not know
// (pageable) is CUDA_ERROR_INVALID_VALUE.
NDX_EMU_API CUresult cuPointerGetAttribute(void* data, int attribute, CUdeviceptr p) {
    if (CUresult r = check_ctx()) return r;
    if (data == nullptr || attribute != 2) return CUDA_ERROR_INVALID_VALUE;
    Lock lock(S().mu);
    const Alloc* a = find_alloc_locked(p, 1);
    if (a == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *static_cast<unsigned*>(data) = a->host ? 1u : 2u;
    return CUDA_SUCCESS;
}

NDX_EMU_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
    return copy_bytes(HTOD, to_host(dst), src, n, nullptr, false);
}
NDX_EMU_API CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
    return copy_bytes(DTOH, dst, to_host(src), n, nullptr, false);
}
NDX_EMU_API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    return copy_bytes(DTOD, to_host(dst), to_host(src), n, nullptr, false);
}
NDX_EMU_API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    return copy_bytes(ANY, to_host(dst), to_host(src), n, nullptr, false);
}
NDX_EMU_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream s) {
    return copy_bytes(HTOD, to_host(dst), src, n, s, true);
}
NDX_EMU_API CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream s) {
    return copy_bytes(DTOH, dst, to_host(src), n, s, true);
}
NDX_EMU_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    return copy_bytes(DTOD, to_host(dst), to_host(src), n, s, true);
}
NDX_EMU_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    return copy_bytes(ANY, to_host(dst), to_host(src), n, s, true);
}

NDX_EMU_API CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char uc, size_t n) {
    return fill(d, uc, n, 1, nullptr, false);
}
NDX_EMU_API CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned int ui, size_t n) {
    return fill(d, ui, n, 4, nullptr, false);
}
NDX_EMU_API CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char uc, size_t n, CUstream s) {
    return fill(d, uc, n, 1, s, true);
}
NDX_EMU_API CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int ui, size_t n, CUstream s) {
    return fill(d, ui, n, 4, s, true);
}

// --------------------------------------------------------------------------- streams

NDX_EMU_API CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags, int priority) {
    (void)priority;  // one queue per stream: priorities change nothing here
    if (CUresult r = check_ctx()) return r;
    if (phStream == nullptr || flags > 1) return CUDA_ERROR_INVALID_VALUE;
    auto s = std::make_shared<Stream>();
    s->flags = flags;
    State& st = S();
    Lock lock(st.mu);
    if (st.async) s->start();
    st.streams[s.get()] = s;
    *phStream = s.get();
    return CUDA_SUCCESS;
}

NDX_EMU_API CUresult cuStreamCreate(CUstream* phStream, unsigned int flags) {
    return cuStreamCreateWithPriority(phStream, flags, 0);
}

NDX_EMU_API CUresult cuStreamDestroy_v2(CUstream hStream) {
    if (CUresult r = check_init()) return r;
    std::shared_ptr<Stream> s;
    {
        Lock lock(S().mu);
        auto it = S().streams.find(hStream);
        if (it == S().streams.end()) return CUDA_ERROR_INVALID_HANDLE;
        s = it->second;
        S().streams.erase(it);
    }
    // The real driver lets queued work finish after the call; waiting here is
    // equivalent for the caller and keeps the worker's lifetime simple.
    wait_stream(s);
    s->shutdown();
    return g_sticky.load();
}

NDX_EMU_API CUresult cuStreamSynchronize(CUstream hStream) {
    if (CUresult r = check_live()) return r;
    std::shared_ptr<Stream> s;
    {
        Lock lock(S().mu);
        s = find_stream_locked(hStream);
    }
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    wait_stream(s);
    return g_sticky.load();
}

NDX_EMU_API CUresult cuStreamQuery(CUstream hStream) {
    if (CUresult r = check_live()) return r;
    std::shared_ptr<Stream> s;
    {
        Lock lock(S().mu);
        s = find_stream_locked(hStream);
    }
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    return stream_idle(s) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

// The live stream and event of two handles (false when either is unknown).
static bool find_stream_and_event(CUstream hStream, CUevent hEvent, std::shared_ptr<Stream>& s,
                                  std::shared_ptr<Event>& e) {
    Lock lock(S().mu);
    s = find_stream_locked(hStream);
    auto it = S().events.find(hEvent);
    if (it != S().events.end()) e = it->second;
    return s && e;
}

NDX_EMU_API CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int flags) {
    if (CUresult r = check_live()) return r;
    if (flags > 1) return CUDA_ERROR_INVALID_VALUE;
    std::shared_ptr<Stream> s;
    std::shared_ptr<Event> e;
    if (!find_stream_and_event(hStream, hEvent, s, e)) return CUDA_ERROR_INVALID_HANDLE;
    if (!S().async) return CUDA_SUCCESS;  // every recorded point has already executed
    unsigned long long gen;
    {
        std::lock_guard<std::mutex> lock(e->m);
        gen = e->recorded;  // the latest cuEventRecord before this call
    }
    if (gen == 0) return CUDA_SUCCESS;  // never recorded: nothing to wait for
    submit(s, [e, gen] { e->wait_for(gen); });
    return CUDA_SUCCESS;
}

NDX_EMU_API CUresult cuStreamWriteValue32(CUstream s, CUdeviceptr addr, unsigned int value, unsigned int flags) {
    return write_value<uint32_t>(s, addr, value, flags);
}
NDX_EMU_API CUresult cuStreamWriteValue32_v2(CUstream s, CUdeviceptr addr, unsigned int value, unsigned int flags) {
    return write_value<uint32_t>(s, addr, value, flags);
}
NDX_EMU_API CUresult cuStreamWriteValue64(CUstream s, CUdeviceptr addr, unsigned long long value,
                                          unsigned int flags) {
    return write_value<uint64_t>(s, addr, value, flags);
}
NDX_EMU_API CUresult cuStreamWriteValue64_v2(CUstream s, CUdeviceptr addr, unsigned long long value,
                                             unsigned int flags) {
    return write_value<uint64_t>(s, addr, value, flags);
}

// ---------------------------------------------------------------------------- events

NDX_EMU_API CUresult cuEventCreate(CUevent* phEvent, unsigned int flags) {
    if (CUresult r = check_ctx()) return r;
    if (phEvent == nullptr || (flags & ~7u) != 0) return CUDA_ERROR_INVALID_VALUE;
    auto e = std::make_shared<Event>();
    e->flags = flags;
    Lock lock(S().mu);
    S().events[e.get()] = e;
    *phEvent = e.get();
    return CUDA_SUCCESS;
}

NDX_EMU_API CUresult cuEventDestroy_v2(CUevent hEvent) {
    if (CUresult r = check_init()) return r;
    Lock lock(S().mu);
    // Queued recordings and waits hold their own reference.
    if (S().events.erase(hEvent) == 0) return CUDA_ERROR_INVALID_HANDLE;
    return g_sticky.load();
}

NDX_EMU_API CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags) {
    if (CUresult r = check_live()) return r;
    if (flags > 1) return CUDA_ERROR_INVALID_VALUE;
    std::shared_ptr<Stream> s;
    std::shared_ptr<Event> e;
    if (!find_stream_and_event(hStream, hEvent, s, e)) return CUDA_ERROR_INVALID_HANDLE;
    unsigned long long gen;
    {
        std::lock_guard<std::mutex> lock(e->m);
        gen = ++e->recorded;
    }
    // Completes even after a fault, so that waiters wake (and then see the error).
    submit(s, [e, gen] { e->complete(gen); }, /*marker=*/true);
    return CUDA_SUCCESS;
}

NDX_EMU_API CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
    return cuEventRecordWithFlags(hEvent, hStream, 0);
}

namespace {
std::shared_ptr<Event> find_event(CUevent h) {
    Lock lock(S().mu);
    auto it = S().events.find(h);
    return it == S().events.end() ? nullptr : it->second;
}
}  // namespace

NDX_EMU_API CUresult cuEventQuery(CUevent hEvent) {
    if (CUresult r = check_live()) return r;
    auto e = find_event(hEvent);
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    std::lock_guard<std::mutex> lock(e->m);
    return e->completed >= e->recorded ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

NDX_EMU_API CUresult cuEventSynchronize(CUevent hEvent) {
    if (CUresult r = check_live()) return r;
    auto e = find_event(hEvent);
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    unsigned long long gen;
    {
        std::lock_guard<std::mutex> lock(e->m);
        gen = e->recorded;
    }
    e->wait_for(gen);
    unsigned delay_ms;
    {
        Lock lock(S().mu);
        delay_ms = S().cfg.sync_delay_ms;
    }
    if (delay_ms) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    return g_sticky.load();
}

NDX_EMU_API CUresult cuEventElapsedTime(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
    if (CUresult r = check_live()) return r;
    if (pMilliseconds == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto a = find_event(hStart), b = find_event(hEnd);
    if (!a || !b) return CUDA_ERROR_INVALID_HANDLE;
    const unsigned kDisableTiming = 2;
    if ((a->flags & kDisableTiming) || (b->flags & kDisableTiming)) return CUDA_ERROR_INVALID_HANDLE;
    std::chrono::steady_clock::time_point ta, tb;
    for (auto* e : {a.get(), b.get()}) {
        std::lock_guard<std::mutex> lock(e->m);
        if (e->recorded == 0) return CUDA_ERROR_INVALID_HANDLE;
        if (e->completed < e->recorded) return CUDA_ERROR_NOT_READY;
        (e == a.get() ? ta : tb) = e->when;
    }
    *pMilliseconds = std::chrono::duration<float, std::milli>(tb - ta).count();
    return CUDA_SUCCESS;
}

// --------------------------------------------------------------------------- modules

NDX_EMU_API CUresult cuModuleLoadData(CUmodule* module, const void* image) {
    return load_module(module, image, JitLogs());
}

NDX_EMU_API CUresult cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int numOptions,
                                        CUjit_option* options, void** optionValues) {
    if (numOptions > 0 && (options == nullptr || optionValues == nullptr)) return CUDA_ERROR_INVALID_VALUE;
    enum { INFO_LOG_BUFFER = 3, INFO_LOG_SIZE = 4, ERROR_LOG_BUFFER = 5, ERROR_LOG_SIZE = 6 };
    JitLogs logs;
    logs.values = optionValues;
    for (unsigned i = 0; i < numOptions; ++i) {  // other options do not apply to emulation
        const uintptr_t v = (uintptr_t)optionValues[i];
        switch (options[i]) {
            case INFO_LOG_BUFFER: logs.info = static_cast<char*>(optionValues[i]); break;
            case INFO_LOG_SIZE: logs.info_size = v; logs.info_size_index = (int)i; break;
            case ERROR_LOG_BUFFER: logs.error = static_cast<char*>(optionValues[i]); break;
            case ERROR_LOG_SIZE: logs.error_size = v; logs.error_size_index = (int)i; break;
            default: break;
        }
    }
    return load_module(module, image, logs);
}

NDX_EMU_API CUresult cuModuleUnload(CUmodule hmod) {
    if (CUresult r = check_init()) return r;
    Lock lock(S().mu);
    auto it = S().modules.find(hmod);
    if (it == S().modules.end()) return CUDA_ERROR_INVALID_HANDLE;
    for (auto& f : it->second->functions) S().functions.erase(f.second.get());
    S().modules.erase(it);  // queued launches hold the kernel itself, not the module
    return g_sticky.load();
}

NDX_EMU_API CUresult cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
    if (CUresult r = check_live()) return r;
    if (hfunc == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Lock lock(S().mu);
    auto it = S().modules.find(hmod);
    if (it == S().modules.end()) return CUDA_ERROR_INVALID_HANDLE;
    Module& m = *it->second;
    auto f = m.functions.find(name);
    if (f != m.functions.end()) {
        *hfunc = f->second.get();
        return CUDA_SUCCESS;
    }
    auto e = m.entries.find(name);
    const EmuEntry* entry = (e != m.entries.end() && m.lib) ? find_entry(m.lib, name) : nullptr;
    if (entry == nullptr) return CUDA_ERROR_NOT_FOUND;
    // The PTX and its C++ twin must agree on the parameters, or launches would
    // read the wrong bytes: report a stale PTX or kernel library loudly.
    const std::vector<unsigned> want(entry->sizes, entry->sizes + entry->nparams);
    if (e->second != want) {
        std::string got, exp;
        for (unsigned s : e->second) got += " " + std::to_string(s);
        for (unsigned s : want) exp += " " + std::to_string(s);
        std::fprintf(stderr, "ndx cuda emulation: %s: PTX parameter sizes [%s ] differ from the emulated kernel's [%s ]\n",
                     name, got.c_str(), exp.c_str());
        return CUDA_ERROR_INVALID_IMAGE;
    }
    auto fn = std::make_unique<Function>();
    fn->module = &m;
    fn->name = name;
    fn->lib = m.lib;
    fn->entry = entry;
    *hfunc = fn.get();
    S().functions.insert(fn.get());
    m.functions[name] = std::move(fn);
    return CUDA_SUCCESS;
}

// ---------------------------------------------------------------------------- launch

NDX_EMU_API CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                    unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                    unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                    void** kernelParams, void** extra) {
    if (CUresult r = check_ctx()) return r;
    // Only what ABI.md allows: 1-D, whole warps, no shared memory, kernelParams.
    if (gridDimX < 1 || gridDimY != 1 || gridDimZ != 1 || blockDimY != 1 || blockDimZ != 1 || blockDimX < 32 ||
        blockDimX > 1024 || blockDimX % 32 != 0 || sharedMemBytes != 0 || extra != nullptr) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    State& st = S();
    std::shared_ptr<Stream> s;
    const EmuEntry* entry;
    const EmuModule* lib;
    bool fault = false;
    unsigned delay_ms = 0;
    unsigned call_delay_ms = 0;
    {
        Lock lock(st.mu);
        if (st.functions.count(f) == 0) return CUDA_ERROR_INVALID_HANDLE;
        s = find_stream_locked(hStream);
        if (!s) return CUDA_ERROR_INVALID_HANDLE;
        const Function* fn = static_cast<const Function*>(f);
        entry = fn->entry;
        lib = fn->lib;
        for (unsigned i = 0; i < entry->nparams; ++i) {
            if (kernelParams == nullptr || kernelParams[i] == nullptr) return CUDA_ERROR_INVALID_VALUE;
        }
        const unsigned long long nth = ++st.launches_by_name[fn->name];
        fault = fn->name == st.cfg.fault_kernel && nth == st.cfg.fault_nth;
        if (st.async) delay_ms = st.cfg.delay_ms;
        call_delay_ms = st.cfg.call_delay_ms;
    }
    // The arguments are copied at the call, as the real driver does.
    struct Args {
        std::vector<unsigned char> bytes;
        std::vector<void*> ptrs;
    };
    auto args = std::make_shared<Args>();
    std::vector<size_t> offsets;
    size_t total = 0;
    for (unsigned i = 0; i < entry->nparams; ++i) {
        offsets.push_back(total);
        total += (entry->sizes[i] + 15) & ~(size_t)15;  // 16-aligned slots
    }
    args->bytes.resize(total + 16);
    unsigned char* base = args->bytes.data();
    base += (16 - (uintptr_t)base % 16) % 16;
    for (unsigned i = 0; i < entry->nparams; ++i) {
        std::memcpy(base + offsets[i], kernelParams[i], entry->sizes[i]);
        args->ptrs.push_back(base + offsets[i]);
    }
    g_launches++;
    LaunchJob job;
    job.lib = lib;
    job.call = entry->call;
    job.grid = gridDimX;
    job.block = blockDimX;
    submit(s, [job, args, fault, delay_ms]() mutable {
        if (g_sticky) return;  // a faulted context runs nothing more
        if (fault) {
            g_sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
            return;
        }
        if (delay_ms) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
        job.params = args->ptrs.data();
        run_kernel(job);
        g_kernels_run++;
    });
    // NDX_EMU_LAUNCH_CALL_DELAY_MS: the call returns late, its launch already queued,
    // so that other threads' stream operations land between it and the caller's next.
    if (call_delay_ms) std::this_thread::sleep_for(std::chrono::milliseconds(call_delay_ms));
    return CUDA_SUCCESS;
}

// ------------------------------------------------------------------------ test hooks

NDX_EMU_API unsigned long long ndx_emu_launch_count(void) {
    return g_launches.load();
}

NDX_EMU_API unsigned long long ndx_emu_kernels_run(void) {
    return g_kernels_run.load();
}

NDX_EMU_API unsigned long long ndx_emu_copy_count(void) {
    return g_async_copies.load();
}

NDX_EMU_API void ndx_emu_reset(void) {
    State& st = S();
    bool init;
    {
        Lock lock(st.mu);
        init = st.initialized;
    }
    if (init) wait_all_streams();
    Lock lock(st.mu);
    g_sticky = 0;
    g_launches = 0;
    g_kernels_run = 0;
    g_async_copies = 0;
    st.launches_by_name.clear();
    st.cfg.read();
}
