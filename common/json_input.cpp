// Limited parsing of untrusted JSON (see json_input.hpp).
#include "common/json_input.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace gpuq::common {

namespace {

// nlohmann's DOM builder, with a depth count that stops the parse (a SAX handler returning false)
// at the first value nested too deep, so no deep value is ever built. The parser callback that
// json::parse offers for this made parsing ~20 times slower: a 1 MB submit took 350 ms of
// gpuqd's thread (plain: 30 ms).
class DepthLimitedDom {
 public:
  DepthLimitedDom(json& result, int max_depth) : m_dom(result, true), m_max(max_depth) {}
  bool null() { return m_dom.null(); }
  bool boolean(bool v) { return m_dom.boolean(v); }
  bool number_integer(json::number_integer_t v) { return m_dom.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { return m_dom.number_unsigned(v); }
  bool number_float(json::number_float_t v, const std::string& s) { return m_dom.number_float(v, s); }
  bool string(json::string_t& v) { return m_dom.string(v); }
  bool binary(json::binary_t& v) { return m_dom.binary(v); }
  bool key(json::string_t& v) { return m_dom.key(v); }
  bool start_object(std::size_t n) { return deeper() && m_dom.start_object(n); }
  bool end_object() { return --m_depth, m_dom.end_object(); }
  bool start_array(std::size_t n) { return deeper() && m_dom.start_array(n); }
  bool end_array() { return --m_depth, m_dom.end_array(); }
  template <class Exception>
  bool parse_error(std::size_t at, const std::string& token, const Exception& e) {
    return m_dom.parse_error(at, token, e);  // throws e
  }
  bool too_deep() const { return m_too_deep; }

 private:
  bool deeper() {
    m_too_deep = m_too_deep || ++m_depth > m_max;
    return !m_too_deep;
  }
  nlohmann::detail::json_sax_dom_parser<json> m_dom;
  int m_max, m_depth = 0;
  bool m_too_deep = false;
};

}  // namespace

json parse_depth_limited(std::string_view text, bool& too_deep, int max_depth) {
  json doc;
  DepthLimitedDom dom(doc, max_depth);
  json::sax_parse(text.begin(), text.end(), &dom);
  too_deep = dom.too_deep();
  return too_deep ? json(json::value_t::discarded) : doc;
}

Result<json> parse_untrusted(std::string_view text, std::string_view what, int max_depth) {
  const std::string name(what);
  if (auto nul = text.find('\0'); nul != std::string_view::npos)
    return Error{ErrorCode::bad_request, name + " contains a NUL byte (at byte " + std::to_string(nul) + ")"};
  bool too_deep = false;
  json doc;
  try {
    doc = parse_depth_limited(text, too_deep, max_depth);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers like 9e999
    // "[json.exception.parse_error.101] parse error at line 1, column 2: ..." -> from "parse error".
    std::string detail = e.what();
    if (auto pos = detail.find("] "); pos != std::string::npos) detail.erase(0, pos + 2);
    if (detail.size() > 300) detail.resize(300);
    return Error{ErrorCode::bad_request, name + " is not valid JSON (or not UTF-8): " + detail};
  }
  if (too_deep)
    return Error{ErrorCode::bad_request, name + " nests deeper than " + std::to_string(max_depth) + " levels"};
  return doc;
}

Result<int> open_job_file(const std::string& path, std::string_view what, std::optional<uid_t> owner) {
  // O_NONBLOCK: a fifo put in the file's place must not hang the reader; fstat refuses it below.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (fd < 0 && errno == ELOOP)
    return Error{ErrorCode::bad_request, std::string(what) + ": " + path + " is a symbolic link, not followed"};
  if (fd < 0)  // missing (not_found), or there and unreadable for now: permissions, I/O (internal)
    return Error{errno == ENOENT ? ErrorCode::not_found : ErrorCode::internal,
                 std::string(what) + ": cannot open " + path + ": " + std::strerror(errno)};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Error{ErrorCode::bad_request, std::string(what) + ": " + path + " is not a regular file"};
  }
  if (owner && st.st_uid != *owner) {
    ::close(fd);
    return Error{ErrorCode::forbidden, std::string(what) + ": " + path + " belongs to uid " + std::to_string(st.st_uid) +
                                           ", not to the job's owner (uid " + std::to_string(*owner) + ")"};
  }
  if (const int flags = ::fcntl(fd, F_GETFL); flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

Result<std::string> read_job_file(const std::string& path, std::size_t max_bytes, std::string_view what,
                                  std::optional<uid_t> owner) {
  auto fd = open_job_file(path, what, owner);
  if (!fd) return fd.error();
  struct stat st {};
  ::fstat(*fd, &st);
  if (static_cast<std::size_t>(st.st_size) > max_bytes) {
    ::close(*fd);
    return Error{ErrorCode::too_large, std::string(what) + ": " + path + " is " + std::to_string(st.st_size) +
                                           " bytes, over the limit of " + std::to_string(max_bytes)};
  }
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    ssize_t n = ::pread(*fd, text.data() + got, text.size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(*fd);
      return Error{ErrorCode::internal, std::string(what) + ": cannot read " + path + ": " + std::strerror(err)};
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(*fd);
  text.resize(got);  // shrunk meanwhile: what is there (a grown file is read up to its old size)
  return text;
}

Result<json> read_untrusted_file(const std::string& path, std::size_t max_bytes, std::string_view what,
                                 std::optional<uid_t> owner) {
  auto text = read_job_file(path, max_bytes, what, owner);
  if (!text) return text.error();
  return parse_untrusted(*text, what);
}

}  // namespace gpuq::common
