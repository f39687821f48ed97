#include "staging_target.h"

namespace sluice::checkpoint_engine::internal {
namespace {

// Handle is PublishHandle or ShmPublishHandle (same staging API).
template <typename Handle>
class Staged final : public StagedVersion {
 public:
  Staged(std::unique_ptr<Handle> handle, const Layout* layout) : handle_(std::move(handle)), layout_(layout) {}
  Result<std::span<std::byte>> Stage(size_t t) override { return handle_->StageInPlace((*layout_)[t].name); }
  Status Seal(size_t t, uint64_t checksum) override { return handle_->SealInPlace((*layout_)[t].name, checksum); }
  Status Commit() override { return handle_->Commit(); }

 private:
  std::unique_ptr<Handle> handle_;  // aborts on destruction unless committed
  const Layout* layout_;
};

template <typename Store>
class Target final : public StagingTarget {
 public:
  explicit Target(std::shared_ptr<Store> store) : store_(std::move(store)) {}
  const Layout& layout() const override { return store_->layout(); }
  int64_t latest_version() const override { return store_->latest_version(); }
  Result<std::unique_ptr<StagedVersion>> Begin(int64_t version) override {
    auto handle = store_->BeginPublish(version);
    if (!handle.ok()) return handle.status();
    using Handle = typename std::remove_reference_t<decltype(*handle.value())>;
    return std::unique_ptr<StagedVersion>(new Staged<Handle>(std::move(handle).value(), &store_->layout()));
  }

 private:
  std::shared_ptr<Store> store_;
};

}  // namespace

std::unique_ptr<StagingTarget> MakeStagingTarget(std::shared_ptr<VersionStore> store) {
  return std::make_unique<Target<VersionStore>>(std::move(store));
}

std::unique_ptr<StagingTarget> MakeStagingTarget(std::shared_ptr<ShmPublisher> store) {
  return std::make_unique<Target<ShmPublisher>>(std::move(store));
}

}  // namespace sluice::checkpoint_engine::internal
