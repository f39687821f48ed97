#include "sluice/common/file_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace sluice {
namespace {

namespace fs = std::filesystem;

fs::path FreshDir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("sluice-file-util-" + name + "-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

TEST(RemoveTreeTest, RemovesNestedDirectoriesAndFiles) {
  fs::path dir = FreshDir("nested");
  fs::create_directories(dir / "a" / "b" / "c");
  std::ofstream(dir / "a" / "b" / "c" / "f") << "x";
  std::ofstream(dir / "top") << "y";
  ASSERT_TRUE(RemoveTree(dir.string()).ok());
  EXPECT_FALSE(fs::exists(dir));
}

TEST(RemoveTreeTest, RemovesLinksNotWhatTheyPointTo) {
  fs::path dir = FreshDir("links");
  fs::path outside = FreshDir("outside");
  std::ofstream(outside / "keep") << "z";
  fs::create_directory_symlink(outside, dir / "to-outside");
  fs::create_symlink(outside / "keep", dir / "to-file");
  ASSERT_TRUE(RemoveTree(dir.string()).ok());
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_TRUE(fs::exists(outside / "keep"));
  // A link given directly is removed, its target kept.
  fs::create_directory_symlink(outside, FreshDir("link-itself") / "l");
  fs::path link = fs::temp_directory_path() / ("sluice-file-util-link-itself-" + std::to_string(::getpid())) / "l";
  ASSERT_TRUE(RemoveTree(link.string()).ok());
  EXPECT_FALSE(fs::is_symlink(link));
  EXPECT_TRUE(fs::exists(outside / "keep"));
  ASSERT_TRUE(RemoveTree(link.parent_path().string()).ok());
  ASSERT_TRUE(RemoveTree(outside.string()).ok());
  EXPECT_FALSE(fs::exists(outside));
}

TEST(RemoveTreeTest, AFileAndAMissingPath) {
  fs::path dir = FreshDir("file");
  std::ofstream(dir / "f") << "x";
  ASSERT_TRUE(RemoveTree((dir / "f").string()).ok());
  EXPECT_FALSE(fs::exists(dir / "f"));
  EXPECT_TRUE(RemoveTree((dir / "missing").string()).ok());
  EXPECT_TRUE(RemoveTree(dir.string()).ok());
}

TEST(RemoveTreeTest, APathThroughAFileIsAnErrorNamingIt) {
  fs::path dir = FreshDir("through");
  std::ofstream(dir / "f") << "x";
  Status s = RemoveTree((dir / "f" / "g").string());
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find((dir / "f" / "g").string()), std::string::npos) << s.message();
  EXPECT_TRUE(fs::exists(dir / "f"));
  EXPECT_TRUE(RemoveTree(dir.string()).ok());
}

}  // namespace
}  // namespace sluice
