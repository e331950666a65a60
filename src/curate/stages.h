// Factories of the built-in stages (registered by type name in stages.cpp).
#pragma once

#include <memory>

#include "curate/stage.h"

namespace loom::curate {

std::unique_ptr<Stage> make_clean_stage(const StageParams& p);
std::unique_ptr<Stage> make_gopher_quality_stage(const StageParams& p);
std::unique_ptr<Stage> make_gopher_repetition_stage(const StageParams& p);
std::unique_ptr<Stage> make_c4_stage(const StageParams& p);
std::unique_ptr<Stage> make_fineweb_stage(const StageParams& p);
std::unique_ptr<Stage> make_pii_stage(const StageParams& p);
std::unique_ptr<Stage> make_exact_dedup_stage(const StageParams& p);
std::unique_ptr<Stage> make_fuzzy_dedup_stage(const StageParams& p);
std::unique_ptr<Stage> make_html_extract_stage(const StageParams& p);
std::unique_ptr<Stage> make_langid_stage(const StageParams& p);
std::unique_ptr<Stage> make_quality_classifier_stage(const StageParams& p);
std::unique_ptr<Stage> make_length_stage(const StageParams& p);

}  // namespace loom::curate
