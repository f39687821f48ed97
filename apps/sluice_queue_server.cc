// sluice_queue_server: a TransferQueue (one controller, N storage units)
// served over ZeroMQ, or with --serve-units a storage server holding some
// units of a hub whose controller's server is elsewhere. Prints the bound
// endpoint as the first line of stdout, then serves until SIGINT or SIGTERM
// and shuts down cleanly.
//
// Exit status: 0 after a clean shutdown, 2 for bad flags, 1 if the server
// could not start (e.g. the address is in use).
#include <pthread.h>
#include <sys/stat.h>

#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "sluice/common/logging.h"
#include "sluice/runtime/process.h"
#include "sluice/transfer_queue/server.h"
#include "sluice/transfer_queue/server_flags.h"

namespace {

int ExitCodeFor(const sluice::Status& status) {
  switch (status.code()) {
    case sluice::StatusCode::kInvalidArgument:
    case sluice::StatusCode::kNotFound:
    case sluice::StatusCode::kOutOfRange:
      return 2;
    default:
      return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  using sluice::transfer_queue::ParseServerFlags;
  using sluice::transfer_queue::TransferQueueServer;
  const std::vector<std::string> args(argv + 1, argv + argc);
  sluice::Result<sluice::transfer_queue::ServerFlags> flags = ParseServerFlags(args);
  if (!flags.ok()) {
    std::fprintf(stderr, "error: %s\n", flags.status().ToString().c_str());
    return ExitCodeFor(flags.status());
  }
  if (flags->help) {
    std::fputs(flags->usage.c_str(), stdout);
    return 0;
  }
  // As the launcher does: freed message buffers stay in the heap instead of
  // going back to the kernel, so the next message does not fault pages in.
  sluice::runtime::TuneAllocator();
  if (!flags->token_file.empty()) {
    struct stat st {};
    if (stat(flags->token_file.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
      SLUICE_LOG(WARNING) << "--token-file " << flags->token_file << " is readable by other users; chmod 600 it";
    }
  }

  // Every thread the server starts inherits this mask: the signals are taken
  // only by sigwait below, never by a worker in the middle of a request.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto server = TransferQueueServer::Start(flags->options);
  if (!server.ok()) {
    std::fprintf(stderr, "error: %s\n", server.status().ToString().c_str());
    return ExitCodeFor(server.status());
  }
  std::printf("%s\n", (*server)->endpoint().c_str());
  std::fflush(stdout);
  const sluice::transfer_queue::ServerOptions& o = flags->options;
  if (o.storage_only) {
    SLUICE_LOG(INFO) << "sluice_queue_server: serving storage units " << o.first_unit << ".."
                     << o.first_unit + o.unit_count - 1 << " of " << o.storage_units << " on " << (*server)->endpoint();
  } else {
    SLUICE_LOG(INFO) << "sluice_queue_server: serving on " << (*server)->endpoint();
  }

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  SLUICE_LOG(INFO) << "sluice_queue_server: signal " << signal_number << ", shutting down";
  (*server)->Stop();
  const sluice::transfer_queue::ServerCounters c = (*server)->counters();
  SLUICE_LOG(INFO) << "sluice_queue_server: served " << c.requests << " requests (" << c.error_replies
                   << " error replies, " << c.malformed << " malformed, " << c.unauthenticated << " unauthenticated, "
                   << c.busy << " busy, " << c.writes_expired << " writes expired)";
  return 0;
}
