// cuda-emu: the fibers emu_cuda.h schedules (their stacks and the switch between them), and the
// report of the launches the harness prints at the end.
//
// On x86-64 a fiber switch is a few instructions (emu_switch below: the callee-saved registers
// on the stack, then the stack pointer); elsewhere it is ucontext's swapcontext, which makes a
// system call at every switch and is several times slower. Each fiber's stack is mapped with an
// inaccessible page below it, so a kernel that overflows its stack faults instead of writing
// over another thread's.
#include "emu_cuda.h"
#include "emu_report.h"

#include <sys/mman.h>
#include <unistd.h>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace emu {
namespace {

constexpr size_t kStackBytes = 256 * 1024;

char* map_stack() {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  void* base = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                    -1, 0);
  if (base == MAP_FAILED || mprotect(base, page, PROT_NONE) != 0) {
    std::fprintf(stderr, "cuda-emu: cannot map a fiber stack\n");
    std::abort();
  }
  return static_cast<char*>(base) + page;
}

[[noreturn]] void finish_current() {
  sched.current->state = State::Done;
  fiber_yield();
  std::abort();  // (a finished fiber is never resumed: fiber_prepare starts it afresh)
}

}  // namespace
}  // namespace emu

#if defined(__x86_64__)

// emu_switch(save, load): pushes the callee-saved registers on the running stack, stores the
// stack pointer in *save, then takes `load` as the stack pointer and pops the registers saved
// there; its `ret` returns into the fiber (or the scheduler) that saved `load`.
extern "C" void emu_switch(void** save, void* load);
asm(R"(
    .text
    .p2align 4
    .globl emu_switch
    .hidden emu_switch
    .type emu_switch, @function
emu_switch:
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
    .size emu_switch, .-emu_switch
)");

namespace {
void* scheduler_context = nullptr;

// Where a prepared fiber's first switch returns to: runs the block's body as this thread.
extern "C" [[noreturn]] void emu_fiber_main() {
  (*emu::sched.body)();
  emu::finish_current();
}
}  // namespace

namespace emu {

void fiber_prepare(Fiber& f) {
  if (!f.stack) f.stack = map_stack();
  void** sp = reinterpret_cast<void**>(f.stack + kStackBytes);  // 16-byte aligned
  *--sp = nullptr;                                    // (emu_fiber_main's return address: none)
  *--sp = reinterpret_cast<void*>(&emu_fiber_main);  // where emu_switch's ret goes
  for (int i = 0; i < 6; ++i) *--sp = nullptr;        // rbp, rbx, r12-r15
  f.context = sp;
}
void fiber_resume(Fiber& f) { emu_switch(&scheduler_context, f.context); }
void fiber_yield() { emu_switch(&sched.current->context, scheduler_context); }

}  // namespace emu

#else  // ucontext

namespace {
ucontext_t scheduler_context;
void fiber_main() {
  (*emu::sched.body)();
  emu::finish_current();
}
}  // namespace

namespace emu {

void fiber_prepare(Fiber& f) {
  if (!f.stack) f.stack = map_stack();
  if (!f.context) f.context = new ucontext_t;
  ucontext_t* c = static_cast<ucontext_t*>(f.context);
  getcontext(c);
  c->uc_stack.ss_sp = f.stack;
  c->uc_stack.ss_size = kStackBytes;
  c->uc_link = nullptr;
  makecontext(c, &fiber_main, 0);
}
void fiber_resume(Fiber& f) { swapcontext(&scheduler_context, static_cast<ucontext_t*>(f.context)); }
void fiber_yield() { swapcontext(static_cast<ucontext_t*>(sched.current->context), &scheduler_context); }

}  // namespace emu

#endif

namespace emu {

long total_launches() {
  std::lock_guard<std::mutex> lock(launch_mutex());
  long n = 0;
  for (const auto& [name, count] : launch_counts()) n += count;
  return n;
}

void write_report(std::FILE* out) {
  std::lock_guard<std::mutex> lock(launch_mutex());
  std::fprintf(out, "cuda-emu: launches per kernel:\n");
  for (const auto& [name, count] : launch_counts()) std::fprintf(out, "  %8ld  %s\n", count, name.c_str());
  for (const auto& [what, count] : warning_counts()) std::fprintf(out, "cuda-emu: warning (x%ld): %s\n", count, what.c_str());
}

}  // namespace emu

namespace toy::cuda {
// (profile.cpp times launches with CUDA events, which the emulator has not: no profile here)
void profile_mark(const char*) {}
}  // namespace toy::cuda
