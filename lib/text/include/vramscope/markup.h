// Escaping text for HTML and XML: the one escaper of both (the HTML report, the JUnit file of
// `vramscope check`). Pure functions; thread-safe.
#ifndef VRAMSCOPE_MARKUP_H_
#define VRAMSCOPE_MARKUP_H_

#include <string>
#include <string_view>

namespace vramscope {

// Safe in HTML5 and XML 1.0 text and in quoted attribute values: & < > " ' as entities
// (&amp; &lt; &gt; &quot; &#39;), tab, newline and CR as character references (an attribute
// keeps them), other control characters (not allowed in XML 1.0) as '?'. Other bytes, UTF-8
// included, pass unchanged.
std::string MarkupEscape(std::string_view text);

}  // namespace vramscope

#endif  // VRAMSCOPE_MARKUP_H_
