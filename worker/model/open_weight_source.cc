// OpenWeightSource: a directory is a Hugging Face checkpoint folder (worker/hf), a file is GGUF.
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/model/weight_source.h"
#ifdef TINYSERVE_HAVE_HF
#include "worker/hf/hf_config.h"
#endif

namespace tinyserve {
namespace {

// Another source with a changed config; tensors and tokenizer pass through.
class ConfigOverride final : public WeightSource {
 public:
  ConfigOverride(std::unique_ptr<WeightSource> inner, ModelConfig config)
      : inner_(std::move(inner)), config_(std::move(config)) {}
  const ModelConfig& config() const override { return config_; }
  const TokenizerData& tokenizer_data() const override { return inner_->tokenizer_data(); }
  absl::StatusOr<TensorRef> Get(const std::string& name) const override {
    return inner_->Get(name);
  }
  bool Has(const std::string& name) const override { return inner_->Has(name); }
  std::string Describe() const override { return inner_->Describe(); }
  void DropPages(const void* data, size_t bytes) const override { inner_->DropPages(data, bytes); }

 private:
  std::unique_ptr<WeightSource> inner_;
  ModelConfig config_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<WeightSource>> WithRopeScaling(
    std::unique_ptr<WeightSource> source, const std::string& rope_scaling_json) {
  if (rope_scaling_json.empty()) return source;
  ModelConfig c = source->config();
  if (c.rope_style == RopeStyle::kNone)
    return absl::UnimplementedError(
        absl::StrCat("rope_scaling: ", ArchName(c), " has no RoPE to scale"));
#ifdef TINYSERVE_HAVE_HF
  TS_RETURN_IF_ERROR(ApplyRopeScaling(rope_scaling_json, "rope_scaling", &c));
  return std::make_unique<ConfigOverride>(std::move(source), std::move(c));
#else
  return absl::UnimplementedError("rope_scaling: this build has no JSON reader (worker/hf)");
#endif
}

absl::StatusOr<std::unique_ptr<WeightSource>> OpenWeightSource(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    const std::string msg =
        absl::StrCat("model path '", path, "' cannot be opened: ", std::strerror(err));
    if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(msg);
    return absl::Status(absl::ErrnoToStatusCode(err), msg);
  }
  if (S_ISDIR(st.st_mode)) {
#ifdef TINYSERVE_HAVE_HF
    return OpenHfWeightSource(path);
#else
    return absl::UnimplementedError(absl::StrCat(
        "model path '", path, "' is a directory, and this build cannot read Hugging Face "
        "folders (worker/hf is not built)"));
#endif
  }
  return OpenGgufWeightSource(path);
}

}  // namespace tinyserve
