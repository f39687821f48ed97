#include "sluice/transfer_queue/server_flags.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "net/net_test_util.h"
#include "sluice/common/file_util.h"
#include "test_util.h"

namespace sluice::transfer_queue {
namespace {

TEST(ServerFlagsTest, ColumnsParse) {
  Result<std::vector<ColumnSchema>> cols = ParseColumnList("prompt:I64:*,reward:f32:,mask:U8:4x2,x:BF16:-1x8");
  ASSERT_TRUE(cols.ok()) << cols.status().ToString();
  ASSERT_EQ(cols->size(), 4u);
  EXPECT_EQ((*cols)[0], (ColumnSchema{"prompt", DType::kI64, {kRaggedDim}}));
  EXPECT_EQ((*cols)[1], (ColumnSchema{"reward", DType::kF32, {}}));
  EXPECT_EQ((*cols)[2], (ColumnSchema{"mask", DType::kU8, {4, 2}}));
  EXPECT_EQ((*cols)[3], (ColumnSchema{"x", DType::kBF16, {kRaggedDim, 8}}));
  TQ_EXPECT_ERROR(ParseColumnList("a:I64"), kInvalidArgument, "entry 'a:I64': needs exactly two ':'");
  TQ_EXPECT_ERROR(ParseColumnList("a:Q8:"), kInvalidArgument, "unknown dtype 'Q8'");
  TQ_EXPECT_ERROR(ParseColumnList("a:I64:4xz"), kInvalidArgument, "dimension 'z'");
  TQ_EXPECT_ERROR(ParseColumnList("a:I64:4x*"), kInvalidArgument, "only the first dimension may be ragged");
  TQ_EXPECT_ERROR(ParseColumnList(":I64:"), kInvalidArgument, "name is empty");
  TQ_EXPECT_ERROR(ParseColumnList("a:I64:,a:F32:"), kInvalidArgument, "'a' is listed twice");
}

TEST(ServerFlagsTest, ByteSizes) {
  EXPECT_EQ(*ParseByteSize("--x", "123"), 123u);
  EXPECT_EQ(*ParseByteSize("--x", "64K"), 64u << 10);
  EXPECT_EQ(*ParseByteSize("--x", "8G"), uint64_t{8} << 30);
  TQ_EXPECT_ERROR(ParseByteSize("--capacity-bytes", "8X"), kInvalidArgument, "--capacity-bytes: '8X'");
  TQ_EXPECT_ERROR(ParseByteSize("--x", "-1"), kInvalidArgument, "not a byte count");
  TQ_EXPECT_ERROR(ParseByteSize("--x", "99999999999999999T"), kInvalidArgument, "");
}

TEST(ServerFlagsTest, FlagsMapToOptions) {
  Result<ServerFlags> f = ParseServerFlags({"--bind",
                                            "tcp://127.0.0.1:5555",
                                            "--capacity-bytes=1G",
                                            "--capacity-rows",
                                            "1000",
                                            "--storage-units",
                                            "4",
                                            "--columns",
                                            "prompt:I64:*",
                                            "--tasks",
                                            "reward,train",
                                            "--lease-timeout-ms",
                                            "5000",
                                            "--max-tensor-bytes",
                                            "1M",
                                            "--workers",
                                            "2",
                                            "--shm-rings",
                                            "3",
                                            "--shm-ring-bytes",
                                            "64K",
                                            "--direct-connections",
                                            "0"});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const ServerOptions& o = f->options;
  EXPECT_EQ(o.bind, "tcp://127.0.0.1:5555");
  EXPECT_EQ(o.controller.capacity_bytes, uint64_t{1} << 30);
  EXPECT_EQ(o.controller.capacity_rows, 1000u);
  EXPECT_EQ(o.storage_units, 4u);
  EXPECT_EQ(o.controller.tasks, (std::vector<std::string>{"reward", "train"}));
  EXPECT_EQ(o.controller.default_lease_timeout, std::chrono::milliseconds(5000));
  EXPECT_EQ(o.max_message_bytes, (uint64_t{1} << 20) + (uint64_t{1} << 20));
  EXPECT_EQ(o.workers, 2u);
  EXPECT_EQ(o.shm_rings, 3u);
  EXPECT_EQ(o.shm_ring_bytes, 64u << 10);
  EXPECT_EQ(o.direct_connections, 0u);
  EXPECT_TRUE(o.token.empty());
  EXPECT_TRUE(ParseServerFlags({"--help"})->help);
}

TEST(ServerFlagsTest, BadFlagsAreNamed) {
  TQ_EXPECT_ERROR(ParseServerFlags({"--storage-units", "0"}), kInvalidArgument, "storage-units");
  TQ_EXPECT_ERROR(ParseServerFlags({"--capacity-rows", "lots"}), kInvalidArgument, "capacity-rows");
  TQ_EXPECT_ERROR(ParseServerFlags({"--bogus", "1"}), kInvalidArgument, "bogus");
  TQ_EXPECT_ERROR(ParseServerFlags({"--bind", "udp://x"}), kInvalidArgument, "--bind: endpoint 'udp://x'");
  TQ_EXPECT_ERROR(ParseServerFlags({"--bind", "tcp://127.0.0.1:99999"}), kInvalidArgument,
                  "port '99999' is not a number in 0..65535");
  TQ_EXPECT_ERROR(ParseServerFlags({"--bind", "tcp://127.0.0.1"}), kInvalidArgument, "missing host or port");
  TQ_EXPECT_ERROR(ParseServerFlags({"--token-file", testing::TempDir()}), kInvalidArgument, "is a directory");
  TQ_EXPECT_ERROR(ParseServerFlags({"--bind", "tcp://0.0.0.0:0"}), kInvalidArgument, "--token-file is required");
  TQ_EXPECT_ERROR(ParseServerFlags({"--tasks", "a,,b"}), kInvalidArgument, "--tasks: task name is empty");
  TQ_EXPECT_ERROR(ParseServerFlags({"--tasks", "a,a"}), kInvalidArgument, "listed twice");
  TQ_EXPECT_ERROR(ParseServerFlags({"--max-tensor-bytes", "1M", "--max-message-bytes", "1M"}), kInvalidArgument,
                  "--max-message-bytes");
  TQ_EXPECT_ERROR(ParseServerFlags({"--token-file", "/nonexistent/token"}), kInvalidArgument, "cannot read");
  TQ_EXPECT_ERROR(ParseServerFlags({"extra"}), kInvalidArgument, "unexpected argument 'extra'");
  TQ_EXPECT_ERROR(ParseServerFlags({"--shm-rings", "5000"}), kInvalidArgument, "shm-rings");
  TQ_EXPECT_ERROR(ParseServerFlags({"--shm-ring-bytes", "100"}), kInvalidArgument, "--shm-ring-bytes 100");
}

TEST(ServerFlagsTest, StorageServerAndStorageHostsFlags) {
  const std::string dir = testing::TempDir();
  testing::WriteFile(dir + "/peer", "peer secret\n");
  testing::WriteFile(dir + "/token", "client secret\n");
  const std::string peer = dir + "/peer";
  Result<ServerFlags> f =
      ParseServerFlags({"--storage-units", "4", "--storage-hosts", "1@tcp://10.0.0.2:5601,2-3@tcp://10.0.0.3:5602",
                        "--peer-token-file", peer, "--storage-connect-timeout-ms", "2500"});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_EQ(f->options.storage_hosts.size(), 2u);
  EXPECT_EQ(f->options.storage_hosts[0].first_unit, 1u);
  EXPECT_EQ(f->options.storage_hosts[0].count, 1u);
  EXPECT_EQ(f->options.storage_hosts[0].endpoint, "tcp://10.0.0.2:5601");
  EXPECT_EQ(f->options.storage_hosts[1].first_unit, 2u);
  EXPECT_EQ(f->options.storage_hosts[1].count, 2u);
  EXPECT_EQ(f->options.peer_token, "peer secret");
  EXPECT_EQ(f->options.storage_connect_timeout, std::chrono::milliseconds(2500));
  EXPECT_FALSE(f->options.storage_only);

  f = ParseServerFlags({"--storage-units", "4", "--serve-units", "2-3", "--peer-token-file", peer});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_TRUE(f->options.storage_only);
  EXPECT_EQ(f->options.first_unit, 2u);
  EXPECT_EQ(f->options.unit_count, 2u);
  f = ParseServerFlags({"--storage-units", "4", "--serve-units", "1", "--peer-token-file", peer});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->options.first_unit, 1u);
  EXPECT_EQ(f->options.unit_count, 1u);

  const std::vector<std::string> base = {"--storage-units", "4", "--peer-token-file", peer};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), base.begin(), base.end());
    return ParseServerFlags(extra);
  };
  TQ_EXPECT_ERROR(ParseServerFlags({"--storage-units", "4", "--serve-units", "1"}), kInvalidArgument,
                  "--serve-units needs --peer-token-file");
  TQ_EXPECT_ERROR(ParseServerFlags({"--storage-hosts", "1@tcp://10.0.0.2:1"}), kInvalidArgument,
                  "--storage-hosts needs --peer-token-file");
  TQ_EXPECT_ERROR(with({"--serve-units", "4"}), kInvalidArgument, "names unit 4, but --storage-units is 4");
  TQ_EXPECT_ERROR(with({"--serve-units", "3-1"}), kInvalidArgument, "'3-1' is not a unit or a range");
  TQ_EXPECT_ERROR(with({"--serve-units", "x"}), kInvalidArgument, "--serve-units: 'x'");
  TQ_EXPECT_ERROR(with({"--serve-units", "1", "--columns", "prompt:I64:*"}), kInvalidArgument,
                  "--columns, --tasks and --ack-log belong on the controller's server");
  TQ_EXPECT_ERROR(with({"--serve-units", "1", "--ack-log", "/tmp/acks"}), kInvalidArgument,
                  "--columns, --tasks and --ack-log belong on the controller's server");
  TQ_EXPECT_ERROR(with({"--serve-units", "1", "--shm-bytes", "64M"}), kInvalidArgument, "no shared-memory arena");
  TQ_EXPECT_ERROR(with({"--serve-units", "1", "--open-write-timeout-ms", "0"}), kInvalidArgument,
                  "--open-write-timeout-ms must be > 0");
  TQ_EXPECT_ERROR(with({"--serve-units", "1", "--storage-hosts", "2@tcp://10.0.0.2:1"}), kInvalidArgument, "not both");
  TQ_EXPECT_ERROR(with({"--storage-hosts", "1-2@tcp://10.0.0.2:1,2@tcp://10.0.0.3:1"}), kInvalidArgument,
                  "storage unit 2 is served by two storage servers");
  TQ_EXPECT_ERROR(with({"--storage-hosts", "tcp://10.0.0.2:1"}), kInvalidArgument, "is not UNITS@ENDPOINT");
  TQ_EXPECT_ERROR(with({"--storage-hosts", "1@udp://x"}), kInvalidArgument, "--storage-hosts: endpoint 'udp://x'");
  TQ_EXPECT_ERROR(with({"--storage-hosts", "1-9@tcp://10.0.0.2:1"}), kInvalidArgument, "names unit 9");
  testing::WriteFile(dir + "/same", "client secret");
  TQ_EXPECT_ERROR(ParseServerFlags({"--token-file", dir + "/token", "--peer-token-file", dir + "/same"}),
                  kInvalidArgument, "same secret as --token-file");
  TQ_EXPECT_ERROR(ParseServerFlags({"--peer-token-file", dir + "/missing"}), kInvalidArgument,
                  "--peer-token-file: cannot read");
  static_cast<void>(sluice::RemoveTree(dir));
}

TEST(ServerFlagsTest, LocalhostIsLoopback) {
  Result<ServerFlags> f = ParseServerFlags({"--bind", "tcp://localhost:0"});
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_TRUE(IsLoopbackEndpoint("tcp://localhost:5555"));
  EXPECT_FALSE(IsLoopbackEndpoint("tcp://localhost.example.com:5555"));
}

TEST(ServerFlagsTest, TokenFile) {
  const std::string dir = testing::TempDir();
  testing::WriteFile(dir + "/t", "  secret value \n\n");
  Result<ServerFlags> f = ParseServerFlags({"--token-file", dir + "/t", "--bind", "tcp://0.0.0.0:0"});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->options.token, "  secret value");  // trailing whitespace only
  testing::WriteFile(dir + "/empty", "\n");
  TQ_EXPECT_ERROR(ParseServerFlags({"--token-file", dir + "/empty"}), kInvalidArgument, "is empty");
  testing::WriteFile(dir + "/long", std::string(300, 'x'));
  TQ_EXPECT_ERROR(ParseServerFlags({"--token-file", dir + "/long"}), kInvalidArgument, "at most 256");
  static_cast<void>(sluice::RemoveTree(dir));
}

}  // namespace
}  // namespace sluice::transfer_queue
