#include "core/jsonl.h"

#include <string_view>

#include "core/error.h"
#include "core/fs.h"

namespace loom {

void for_each_jsonl(const std::string& path,
                    const std::function<void(const Json&, const std::string&)>& fn) {
  const std::string text = read_file(path);
  size_t line = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    ++line;
    const std::string_view l(text.data() + pos, end - pos);
    pos = end + 1;
    if (l.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank line
    const std::string where = cat(path, ":", line);
    fn(Json::parse(l, where), where);
  }
}

}  // namespace loom
