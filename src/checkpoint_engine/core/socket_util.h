// The TCP helpers of sluice/common/socket_util.h under the names this
// library's code uses.
#ifndef SLUICE_SRC_CHECKPOINT_ENGINE_SOCKET_UTIL_H_
#define SLUICE_SRC_CHECKPOINT_ENGINE_SOCKET_UTIL_H_

#include "sluice/common/socket_util.h"

namespace sluice::checkpoint_engine::internal {

using net::ConnectTcp;
using net::Deadline;
using net::ListenTcp;
using net::LoadLe;
using net::LocalPort;
using net::ParseHostPort;
using net::RecvAll;
using net::SendAll;
using net::StoreLe;
using net::UniqueFd;

}  // namespace sluice::checkpoint_engine::internal

#endif  // SLUICE_SRC_CHECKPOINT_ENGINE_SOCKET_UTIL_H_
