// The answer and question text rules of the prep tool: the VQA evaluation's
// answer normalisation, M3AE's, and whitespace collapsing.
#pragma once

#include <string>

namespace vqa::prep {

// The VQA evaluation's answer normalisation: lower case, punctuation
// removed (kept inside numbers such as 1,000 or 2.5), number words to
// digits, articles dropped, whitespace collapsed. "The X-ray." -> "x ray".
std::string answer_normalize(const std::string& answer);

// M3AE's answer normalisation, which builds its label sets (normalize_word
// of its preprocessing's glossary, on the lower-cased answer): each of
// ; / [ ] " { } ( ) = + \ _ - > < @ ` , ? ! is deleted where the answer has
// it next to a space (or has a digit, comma, digit anywhere) and becomes a
// space elsewhere; then the first 32 periods not followed by a digit go (M3AE
// passes re.UNICODE where re.sub takes its count); number words become
// digits, articles go, contractions get their apostrophe ("dont" ->
// "don't"), the words are joined with one space and commas removed.
// "mr - flair" -> "mr flair", "x-ray" -> "x ray", "i.v. contrast" -> "iv
// contrast". Case and digits are ASCII's (M3AE's Python is Unicode's).
std::string answer_normalize_m3ae(const std::string& answer);

// Trimmed, with inner runs of whitespace collapsed to one space.
std::string text_collapse_whitespace(const std::string& text);

}  // namespace vqa::prep
