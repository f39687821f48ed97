#include "sluice/model/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "sluice/common/file_util.h"

namespace sluice::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Parses an in-memory file image; the tensors keep a shared copy alive.
Result<SafetensorsContents> ParseImage(const std::string& image, const std::string& origin = "mem.safetensors") {
  auto owner = std::make_shared<const std::string>(image);
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(owner->data()), owner->size());
  return ParseSafetensors(bytes, owner, origin);
}

// `value` as 8 little-endian bytes, spelled out independent of the host.
std::string Le64(uint64_t value) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  return out;
}

// A file image: length prefix, the header text as given, then `data`.
std::string Image(const std::string& header, const std::string& data = "") {
  return Le64(header.size()) + header + data;
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void ExpectError(const Status& status, StatusCode code, const std::vector<std::string>& needles) {
  EXPECT_EQ(status.code(), code) << status.ToString();
  for (const std::string& needle : needles) {
    EXPECT_NE(status.message().find(needle), std::string::npos) << "'" << needle << "' not in: " << status.ToString();
  }
}

template <typename T>
HostTensor Make(DType dtype, std::vector<int64_t> shape, const std::vector<T>& values) {
  return HostTensor::Copy(dtype, std::move(shape), values.data(), values.size() * sizeof(T));
}

// One tensor of every dtype, plus an empty tensor and a scalar.
TensorMap AllDTypes() {
  TensorMap m;
  m["f64"] = Make<double>(DType::kF64, {2}, {3.141592653589793, -1e300});
  m["f32"] = Make<float>(DType::kF32, {2, 3}, {1.5f, -0.0f, 3.4e38f, 1e-45f, -7.25f, 42.0f});
  m["f16"] = Make<uint16_t>(DType::kF16, {4}, {0x3c00, 0xc000, 0x7c00, 0x7e01});  // 1, -2, inf, a NaN payload
  m["bf16"] = Make<uint16_t>(DType::kBF16, {3}, {0x3f80, 0xffc1, 0x0001});
  m["i64"] = Make<int64_t>(DType::kI64, {2}, {INT64_MIN, INT64_MAX});
  m["i32"] = Make<int32_t>(DType::kI32, {1, 1, 2}, {-5, 1 << 30});
  m["i16"] = Make<int16_t>(DType::kI16, {3}, {-32768, 0, 32767});
  m["i8"] = Make<int8_t>(DType::kI8, {2}, {-128, 127});
  m["u8"] = Make<uint8_t>(DType::kU8, {5}, {0, 1, 127, 128, 255});
  m["bool"] = Make<uint8_t>(DType::kBool, {3}, {1, 0, 1});
  m["empty"] = HostTensor::Copy(DType::kF32, {0, 4}, nullptr, 0);
  m["scalar"] = Make<float>(DType::kF32, {}, {2.5f});
  return m;
}

void ExpectSameTensors(const TensorMap& expected, const TensorMap& actual) {
  ASSERT_EQ(expected.size(), actual.size());
  for (const auto& [name, want] : expected) {
    SCOPED_TRACE(name);
    auto it = actual.find(name);
    ASSERT_NE(it, actual.end());
    const HostTensor& got = it->second;
    EXPECT_EQ(got.dtype, want.dtype);
    EXPECT_EQ(got.shape, want.shape);
    ASSERT_EQ(got.nbytes, want.nbytes);
    if (want.nbytes > 0) {
      EXPECT_EQ(std::memcmp(got.data, want.data, want.nbytes), 0);
    }
  }
}

class SafetensorsFileTest : public testing::Test {
 protected:
  void SetUp() override {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(testing::TempDir()) /
           ("sluice_st_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    static_cast<void>(sluice::RemoveTree(dir_));
    fs::create_directories(dir_);
  }
  void TearDown() override { static_cast<void>(sluice::RemoveTree(dir_)); }
  fs::path dir_;
};

TEST(SafetensorsTest, SerializeParseRoundTripIsBitExact) {
  const TensorMap tensors = AllDTypes();
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"step", "17"}};
  const std::string image = SerializeSafetensors(tensors, metadata);
  auto parsed = ParseImage(image);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ExpectSameTensors(tensors, parsed->tensors);
  EXPECT_EQ(parsed->metadata, metadata);
}

TEST(SafetensorsTest, WriterFollowsTheSpec) {
  const TensorMap tensors = AllDTypes();
  const std::string image = SerializeSafetensors(tensors, {{"format", "pt"}});
  ASSERT_GE(image.size(), 8u);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(image[i]);
  EXPECT_EQ(header_len % 8, 0u) << "data should start 8-byte aligned";
  ASSERT_LE(8 + header_len, image.size());
  const std::string header_text = image.substr(8, header_len);
  EXPECT_EQ(header_text.front(), '{');
  json header = json::parse(header_text);  // trailing padding is whitespace
  EXPECT_EQ(header["__metadata__"], json({{"format", "pt"}}));
  uint64_t total = 0;
  for (const auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    const json& e = header.at(name);
    EXPECT_EQ(e.at("dtype"), std::string(DTypeName(t.dtype)));
    EXPECT_EQ(e.at("shape").get<std::vector<int64_t>>(), t.shape);
    uint64_t begin = e.at("data_offsets")[0], end = e.at("data_offsets")[1];
    ASSERT_EQ(end - begin, t.nbytes);
    if (t.nbytes > 0) {
      EXPECT_EQ(std::memcmp(image.data() + 8 + header_len + begin, t.data, t.nbytes), 0);
    }
    total += t.nbytes;
  }
  EXPECT_EQ(image.size(), 8 + header_len + total);
}

TEST_F(SafetensorsFileTest, WriteReadFileRoundTripIsBitExact) {
  const TensorMap tensors = AllDTypes();
  const std::string path = (dir_ / "t.safetensors").string();
  ASSERT_TRUE(WriteSafetensorsFile(path, tensors).ok());
  EXPECT_EQ(ReadFile(path), SerializeSafetensors(tensors, {{"format", "pt"}}));
  HostTensor kept;
  {
    auto read = ReadSafetensorsFile(path);
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    ExpectSameTensors(tensors, read->tensors);
    EXPECT_EQ(read->metadata.at("format"), "pt");
    kept = read->tensors.at("f32");
  }
  // The tensor holds the mapping alive after the contents and the file are gone.
  fs::remove(path);
  EXPECT_EQ(std::memcmp(kept.data, tensors.at("f32").data, kept.nbytes), 0);
  for (const auto& entry : fs::directory_iterator(dir_)) ADD_FAILURE() << "leftover " << entry.path();
}

TEST(SafetensorsDeathTest, SerializeRejectsTensorsItCouldNotReadBack) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TensorMap reserved;
  reserved["__metadata__"] = Make<float>(DType::kF32, {1}, {1.0f});
  EXPECT_DEATH(SerializeSafetensors(reserved, {}), "__metadata__");
  TensorMap inconsistent;
  inconsistent["w"] = Make<float>(DType::kF32, {2}, {1.0f, 2.0f});
  inconsistent["w"].shape = {3};
  EXPECT_DEATH(SerializeSafetensors(inconsistent, {}), "'w' has 8 bytes");
}

TEST(SafetensorsTest, FilesWithoutTensors) {
  auto parsed = ParseImage(SerializeSafetensors({}, {}));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_TRUE(parsed->tensors.empty());
  EXPECT_TRUE(parsed->metadata.empty());
  auto only_metadata = ParseImage(Image(R"({"__metadata__":{}}  )"));
  ASSERT_TRUE(only_metadata.ok()) << only_metadata.status().ToString();
  EXPECT_TRUE(only_metadata->tensors.empty());
}

// A file written byte by byte from the public spec, not by our writer: tensors
// out of name order in the buffer, an unaligned-length header padded with
// spaces, and little-endian values whose bit patterns are spelled out.
TEST(SafetensorsTest, ReadsHandBuiltSpecFile) {
  const std::string header = R"({"__metadata__":{"format":"pt","source":"hand"},)"
                             R"("zeta":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("alpha":{"dtype":"I16","shape":[1,3],"data_offsets":[10,16]},)"
                             R"("mid":{"dtype":"BF16","shape":[],"data_offsets":[8,10]}}     )";
  const std::string data = std::string("\x00\x00\x80\x3f", 4)    // zeta[0] = 1.0f
                           + std::string("\x00\x00\x20\xc0", 4)  // zeta[1] = -2.5f
                           + std::string("\xc0\x3f", 2)          // mid = bf16 1.5
                           + std::string("\xfe\xff", 2)          // alpha = -2
                           + std::string("\x2c\x01", 2)          //         300
                           + std::string("\x00\x80", 2);         //         -32768
  std::string image;
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) image.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  image += header;
  image += data;

  auto parsed = ParseImage(image);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  const TensorMap& t = parsed->tensors;
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(parsed->metadata, (std::map<std::string, std::string>{{"format", "pt"}, {"source", "hand"}}));

  const HostTensor& zeta = t.at("zeta");
  EXPECT_EQ(zeta.dtype, DType::kF32);
  EXPECT_EQ(zeta.shape, (std::vector<int64_t>{2}));
  float z[2];
  ASSERT_EQ(zeta.nbytes, sizeof(z));
  std::memcpy(z, zeta.data, sizeof(z));
  EXPECT_EQ(z[0], 1.0f);
  EXPECT_EQ(z[1], -2.5f);

  const HostTensor& mid = t.at("mid");
  EXPECT_EQ(mid.dtype, DType::kBF16);
  EXPECT_TRUE(mid.shape.empty());
  uint16_t bf16;
  ASSERT_EQ(mid.nbytes, 2u);
  std::memcpy(&bf16, mid.data, 2);
  EXPECT_EQ(std::bit_cast<float>(uint32_t{bf16} << 16), 1.5f);

  const HostTensor& alpha = t.at("alpha");
  EXPECT_EQ(alpha.dtype, DType::kI16);
  EXPECT_EQ(alpha.shape, (std::vector<int64_t>{1, 3}));
  int16_t a[3];
  ASSERT_EQ(alpha.nbytes, sizeof(a));
  std::memcpy(a, alpha.data, sizeof(a));
  EXPECT_EQ(a[0], -2);
  EXPECT_EQ(a[1], 300);
  EXPECT_EQ(a[2], -32768);
}

struct BadCase {
  const char* what;
  std::string image;
  StatusCode code;
  std::vector<std::string> needles;
};

// Header entry text for one tensor; each part is spliced in verbatim.
std::string Entry(const std::string& dtype, const std::string& shape, const std::string& offsets) {
  return R"({"dtype":)" + dtype + R"(,"shape":)" + shape + R"(,"data_offsets":)" + offsets + "}";
}
// A header holding tensor 'w' with the given entry text.
std::string W(const std::string& entry) { return R"({"w":)" + entry + "}"; }
// A header holding tensors 'a' and 'b'.
std::string AB(const std::string& a, const std::string& b) { return R"({"a":)" + a + R"(,"b":)" + b + "}"; }

TEST(SafetensorsTest, RejectsMalformedFilesWithClearMessages) {
  const std::string d8(8, '\0');  // an 8-byte data buffer
  const std::string f32 = "\"F32\"";
  const std::string valid = Image(W(Entry(f32, "[2]", "[0,8]")), d8);
  ASSERT_TRUE(ParseImage(valid).ok());
  const StatusCode kLoss = StatusCode::kDataLoss;
  const std::vector<BadCase> cases = {
      {"empty file", "", kLoss, {"0 bytes", "too short"}},
      {"shorter than 8 bytes", "\x02\x00\x00", kLoss, {"too short"}},
      {"header longer than file", Le64(100) + "{}", kLoss, {"header length 100", "past the end"}},
      {"header over limit", Le64((uint64_t{100} << 20) + 1) + "{}", kLoss, {"exceeds the limit"}},
      {"huge header length", Le64(UINT64_MAX) + "{}", kLoss, {"exceeds the limit"}},
      {"empty header", Image(""), kLoss, {"JSON object"}},
      {"header not JSON", Image("{not json}"), kLoss, {"not valid JSON"}},
      {"header with trailing junk", Image("{} {}"), kLoss, {"not valid JSON"}},
      {"header JSON array", Image("[1, 2]"), kLoss, {"JSON object"}},
      {"entry not an object", Image(W("[]")), kLoss, {"'w'", "not a JSON object"}},
      {"unknown dtype", Image(W(Entry("\"Q4\"", "[2]", "[0,8]")), d8), kLoss, {"'w'", "unknown dtype \"Q4\""}},
      {"dtype not string", Image(W(Entry("4", "[2]", "[0,8]")), d8), kLoss, {"'w'", "\"dtype\""}},
      {"missing dtype", Image(W(R"({"shape":[2],"data_offsets":[0,8]})"), d8), kLoss, {"'w'", "missing \"dtype\""}},
      {"missing shape", Image(W(R"({"dtype":"F32","data_offsets":[0,8]})"), d8), kLoss, {"'w'", "missing \"shape\""}},
      {"missing data_offsets",
       Image(W(R"({"dtype":"F32","shape":[2]})"), d8),
       kLoss,
       {"'w'", "missing \"data_offsets\""}},
      {"shape not array", Image(W(Entry(f32, "2", "[0,8]")), d8), kLoss, {"'w'", "\"shape\" is not an array"}},
      {"negative shape", Image(W(Entry(f32, "[-2]", "[0,8]")), d8), kLoss, {"'w'", "shape", "non-negative integer"}},
      {"fractional shape", Image(W(Entry(f32, "[2.0]", "[0,8]")), d8), kLoss, {"'w'", "non-negative integer"}},
      {"string shape", Image(W(Entry(f32, "[\"2\"]", "[0,8]")), d8), kLoss, {"'w'", "non-negative integer"}},
      {"huge shape", Image(W(Entry(f32, "[4294967296,4294967296]", "[0,8]")), d8), kLoss, {"'w'"}},
      {"one offset", Image(W(Entry(f32, "[2]", "[8]")), d8), kLoss, {"'w'", "\"data_offsets\""}},
      {"negative offset", Image(W(Entry(f32, "[2]", "[-8,0]")), d8), kLoss, {"'w'", "\"data_offsets\""}},
      {"begin after end", Image(W(Entry(f32, "[1]", "[8,4]")), d8), kLoss, {"'w'", "begin 8 > end 4"}},
      {"offsets past data",
       Image(W(Entry(f32, "[4]", "[0,16]")), d8),
       kLoss,
       {"'w'", "end 16", "past the data buffer"}},
      {"size mismatch", Image(W(Entry(f32, "[3]", "[0,8]")), d8), kLoss, {"'w'", "holds 8 bytes", "needs 12"}},
      {"overlap", Image(AB(Entry(f32, "[2]", "[0,8]"), Entry(f32, "[1]", "[4,8]")), d8), kLoss, {"'b'", "overlaps"}},
      {"aliasing", Image(AB(Entry(f32, "[2]", "[0,8]"), Entry("\"I64\"", "[1]", "[0,8]")), d8), kLoss, {"overlaps"}},
      {"hole",
       Image(AB(Entry(f32, "[1]", "[0,4]"), Entry("\"I16\"", "[1]", "[6,8]")), d8),
       kLoss,
       {"bytes 4..6", "'b'", "belong to no tensor"}},
      {"hole at start", Image(W(Entry(f32, "[1]", "[4,8]")), d8), kLoss, {"bytes 0..4", "belong to no tensor"}},
      {"trailing bytes", valid + "xyz", kLoss, {"3 trailing bytes"}},
      {"metadata not object", Image(R"({"__metadata__":["a"]})"), kLoss, {"\"__metadata__\" is not an object"}},
      {"metadata value not string",
       Image(R"({"__metadata__":{"step":17}})"),
       kLoss,
       {"\"__metadata__\"", "'step'", "not a string"}},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.what);
    auto parsed = ParseImage(c.image, "bad.safetensors");
    std::vector<std::string> needles = c.needles;
    needles.push_back("bad.safetensors");
    ExpectError(parsed.status(), c.code, needles);
  }
}

TEST(SafetensorsTest, TruncatedFileIsDataLoss) {
  const std::string image = SerializeSafetensors(AllDTypes(), {{"format", "pt"}});
  for (size_t chop : {size_t{1}, size_t{7}, size_t{40}}) {
    SCOPED_TRACE(chop);
    auto parsed = ParseImage(image.substr(0, image.size() - chop));
    ExpectError(parsed.status(), StatusCode::kDataLoss, {"past the data buffer", "truncated"});
  }
  // Cut inside the header: the header length now points past the end.
  ExpectError(ParseImage(image.substr(0, 20)).status(), StatusCode::kDataLoss, {"past the end"});
}

TEST_F(SafetensorsFileTest, FileErrors) {
  ExpectError(ReadSafetensorsFile((dir_ / "missing.safetensors").string()).status(), StatusCode::kNotFound,
              {"missing.safetensors"});
  ExpectError(ReadSafetensorsFile(dir_.string()).status(), StatusCode::kInvalidArgument, {"not a regular file"});
  WriteFile(dir_ / "empty.safetensors", "");
  ExpectError(ReadSafetensorsFile((dir_ / "empty.safetensors").string()).status(), StatusCode::kDataLoss,
              {"empty.safetensors", "too short"});
  const std::string image = SerializeSafetensors(AllDTypes(), {});
  WriteFile(dir_ / "cut.safetensors", image.substr(0, image.size() - 3));
  ExpectError(ReadSafetensorsFile((dir_ / "cut.safetensors").string()).status(), StatusCode::kDataLoss,
              {"cut.safetensors", "truncated"});
}

// Every byte range a successful parse hands out must lie inside the buffer
// and match shape x dtype, whatever the corruption.
TEST(SafetensorsTest, RandomCorruptionNeverEscapesTheBuffer) {
  TensorMap tensors;
  tensors["a"] = Make<float>(DType::kF32, {2, 2}, {1, 2, 3, 4});
  tensors["b"] = Make<uint16_t>(DType::kBF16, {3}, {1, 2, 3});
  tensors["c"] = Make<int64_t>(DType::kI64, {}, {9});
  const std::string image = SerializeSafetensors(tensors, {{"k", "v"}});
  const size_t header_len = image.size() - 8 - (16 + 6 + 8);
  std::mt19937 rng(20240601);
  int ok = 0, failed = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::string bad = image;
    const int mode = iter % 4;
    if (mode == 3) {  // rewrite digits: the JSON stays valid, shapes and offsets change
      for (int f = 0; f < 2; ++f) {
        size_t pos = 8 + rng() % header_len;
        while (pos < 8 + header_len && !std::isdigit(static_cast<unsigned char>(bad[pos]))) ++pos;
        if (pos < 8 + header_len) bad[pos] = static_cast<char>('0' + rng() % 10);
      }
    } else if (mode != 1) {  // flip bytes, mostly in the length prefix and header
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) {
        size_t limit = (rng() % 4 == 0) ? bad.size() : std::min<size_t>(bad.size(), 8 + 160);
        bad[rng() % limit] ^= static_cast<char>(1 + rng() % 255);
      }
    }
    if (mode == 1 || mode == 2) bad.resize(rng() % (bad.size() + 1));  // truncate
    auto owner = std::make_shared<const std::string>(bad);
    const auto* begin = reinterpret_cast<const std::byte*>(owner->data());
    auto parsed = ParseSafetensors(std::span<const std::byte>(begin, owner->size()), owner, "fuzz");
    if (!parsed.ok()) {
      ++failed;
      EXPECT_FALSE(parsed.status().message().empty());
      continue;
    }
    ++ok;
    for (const auto& [name, t] : parsed->tensors) {
      auto numel = CheckedNumel(t.shape);
      ASSERT_TRUE(numel.ok()) << name;
      ASSERT_EQ(t.nbytes, *numel * DTypeSize(t.dtype)) << name;
      if (t.nbytes == 0) continue;
      ASSERT_GE(t.data, begin) << name;
      ASSERT_LE(t.data + t.nbytes, begin + owner->size()) << name;
    }
  }
  EXPECT_GT(failed, 1000);  // most corruptions are caught
  EXPECT_GT(ok, 0);         // flips inside tensor data are invisible to the format
}

// ----- Checkpoint directories -----

TensorMap FourTensors() {
  TensorMap m;
  for (const char* name : {"embed.weight", "layers.0.w", "layers.1.w", "norm.weight"}) {
    std::vector<float> v(12);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) + 0.5f * static_cast<float>(name[0]);
    m[name] = Make<float>(DType::kF32, {3, 4}, v);  // 48 bytes each
  }
  return m;
}

TEST_F(SafetensorsFileTest, CheckpointSingleFileLayout) {
  const TensorMap tensors = FourTensors();
  ASSERT_TRUE(SaveCheckpointTensors(dir_.string(), tensors).ok());
  EXPECT_TRUE(fs::exists(dir_ / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dir_ / "model.safetensors.index.json"));
  auto loaded = LoadCheckpointTensors(dir_.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  ExpectSameTensors(tensors, *loaded);
}

TEST_F(SafetensorsFileTest, CheckpointShardedLayout) {
  const TensorMap tensors = FourTensors();
  const fs::path out = dir_ / "nested" / "ckpt";  // created on demand
  ASSERT_TRUE(SaveCheckpointTensors(out.string(), tensors, {.max_shard_bytes = 100}).ok());
  EXPECT_FALSE(fs::exists(out / "model.safetensors"));
  ASSERT_TRUE(fs::exists(out / "model.safetensors.index.json"));
  json index = json::parse(ReadFile(out / "model.safetensors.index.json"));
  ASSERT_TRUE(index.contains("weight_map"));
  const json& map = index["weight_map"];
  ASSERT_EQ(map.size(), tensors.size());
  EXPECT_EQ(index["metadata"]["total_size"], 4 * 48);
  std::set<std::string> shards;
  for (const auto& [name, t] : tensors) shards.insert(map.at(name).get<std::string>());
  // 100-byte shards hold two 48-byte tensors each.
  EXPECT_EQ(shards, (std::set<std::string>{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}));
  for (const std::string& shard : shards) EXPECT_TRUE(fs::is_regular_file(out / shard)) << shard;

  auto loaded = LoadCheckpointTensors(out.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  ExpectSameTensors(tensors, *loaded);
}

TEST_F(SafetensorsFileTest, CheckpointOneShardPerOversizedTensor) {
  ASSERT_TRUE(SaveCheckpointTensors(dir_.string(), FourTensors(), {.max_shard_bytes = 10}).ok());
  for (int i = 1; i <= 4; ++i) {
    EXPECT_TRUE(fs::exists(dir_ / ("model-0000" + std::to_string(i) + "-of-00004.safetensors"))) << i;
  }
  auto loaded = LoadCheckpointTensors(dir_.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  ExpectSameTensors(FourTensors(), *loaded);
}

TEST_F(SafetensorsFileTest, CheckpointLayoutSwitchRemovesStaleEntryFile) {
  TensorMap first = FourTensors();
  ASSERT_TRUE(SaveCheckpointTensors(dir_.string(), first, {.max_shard_bytes = 100}).ok());
  TensorMap second;
  second["only"] = Make<int32_t>(DType::kI32, {2}, {7, 8});
  ASSERT_TRUE(SaveCheckpointTensors(dir_.string(), second).ok());
  EXPECT_FALSE(fs::exists(dir_ / "model.safetensors.index.json"));
  auto loaded = LoadCheckpointTensors(dir_.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  ExpectSameTensors(second, *loaded);

  ASSERT_TRUE(SaveCheckpointTensors(dir_.string(), first, {.max_shard_bytes = 100}).ok());
  EXPECT_FALSE(fs::exists(dir_ / "model.safetensors"));
  auto again = LoadCheckpointTensors(dir_.string());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ExpectSameTensors(first, *again);
}

class ShardedCheckpointTest : public SafetensorsFileTest {
 protected:
  void SetUp() override {
    SafetensorsFileTest::SetUp();
    ASSERT_TRUE(SaveCheckpointTensors(dir_.string(), FourTensors(), {.max_shard_bytes = 100}).ok());
    index_ = json::parse(ReadFile(dir_ / "model.safetensors.index.json"));
  }
  void RewriteIndex() { WriteFile(dir_ / "model.safetensors.index.json", index_.dump()); }
  Status Load() { return LoadCheckpointTensors(dir_.string()).status(); }
  json index_;
};

TEST_F(ShardedCheckpointTest, MissingShardIsNotFound) {
  fs::remove(dir_ / "model-00002-of-00002.safetensors");
  ExpectError(Load(), StatusCode::kNotFound, {"model-00002-of-00002.safetensors"});
}

TEST_F(ShardedCheckpointTest, IndexNamingWrongShardIsDataLoss) {
  ASSERT_EQ(index_["weight_map"]["norm.weight"], "model-00002-of-00002.safetensors");
  index_["weight_map"]["norm.weight"] = "model-00001-of-00002.safetensors";
  RewriteIndex();
  ExpectError(Load(), StatusCode::kDataLoss, {"'norm.weight'", "model-00001-of-00002.safetensors"});
}

TEST_F(ShardedCheckpointTest, IndexNamingAbsentTensorIsDataLoss) {
  index_["weight_map"]["ghost"] = "model-00001-of-00002.safetensors";
  RewriteIndex();
  ExpectError(Load(), StatusCode::kDataLoss, {"'ghost'", "does not contain it"});
}

TEST_F(ShardedCheckpointTest, ShardNamesOutsideTheDirectoryAreRejected) {
  for (const char* shard : {"../model-00001-of-00002.safetensors", "/etc/passwd", "sub/x.safetensors", "..", ".", ""}) {
    SCOPED_TRACE(shard);
    json saved = index_;
    index_["weight_map"]["embed.weight"] = shard;
    RewriteIndex();
    ExpectError(Load(), StatusCode::kInvalidArgument, {"shard name", "'embed.weight'"});
    index_ = saved;
  }
}

TEST_F(ShardedCheckpointTest, MalformedIndexIsDataLoss) {
  WriteFile(dir_ / "model.safetensors.index.json", "{\"weight_map\": ");
  ExpectError(Load(), StatusCode::kDataLoss, {"model.safetensors.index.json", "not a JSON object"});
  WriteFile(dir_ / "model.safetensors.index.json", R"({"metadata": {}})");
  ExpectError(Load(), StatusCode::kDataLoss, {"\"weight_map\""});
  WriteFile(dir_ / "model.safetensors.index.json", R"({"weight_map": {"a": 3}})");
  ExpectError(Load(), StatusCode::kDataLoss, {"'a'", "not a file name"});
}

TEST_F(SafetensorsFileTest, CheckpointDirectoryErrors) {
  ExpectError(LoadCheckpointTensors(dir_.string()).status(), StatusCode::kNotFound,
              {"model.safetensors", "model.safetensors.index.json"});
  ExpectError(LoadCheckpointTensors((dir_ / "absent").string()).status(), StatusCode::kNotFound, {"absent"});
  WriteFile(dir_ / "model.safetensors", "garbage");
  ExpectError(LoadCheckpointTensors(dir_.string()).status(), StatusCode::kDataLoss, {"model.safetensors"});
}

}  // namespace
}  // namespace sluice::model
