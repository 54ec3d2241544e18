// `fsdp-plan --target T`: the search restricted to what the target expresses. The target's single-valued knobs
// become pins, a knob the user pinned to a value the target cannot express is refused (InputError naming it), the
// knobs the search does not enumerate are set to what the target runs, and every other candidate passes through
// SearchRequest::accept.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "export/target_spec.hpp"
#include "search/plan_search.hpp"

namespace fsdp {

// `given(flag)`: whether the user gave that flag. Returns the notes to print (each knob pinned or restricted, why).
// `req.cluster` may change afterwards (--nodes auto): the filter reads the cluster of each call through `req`.
std::vector<std::string> restrict_search(const TargetSpec& spec, const std::function<bool(const std::string&)>& given,
                                         SearchRequest& req);

// Families the target cannot run get a verdict that says so (the search never evaluated them).
void explain_excluded_families(const TargetSpec& spec, SearchResult& r);

}  // namespace fsdp
