#include "sluice/model/tokenizer.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace sluice::model {
namespace {

TEST(ByteTokenizerTest, EncodesEachByteAsItsValue) {
  ByteTokenizer tok;
  EXPECT_EQ(*tok.Encode("Hi!"), (std::vector<TokenId>{72, 105, 33}));
  EXPECT_TRUE(tok.Encode("")->empty());
}

TEST(ByteTokenizerTest, NonAsciiUtf8BytesAreUnsigned) {
  ByteTokenizer tok;
  // "é" is C3 A9 and "€" is E2 82 AC in UTF-8; ids must be 0..255, never negative.
  EXPECT_EQ(*tok.Encode("\xC3\xA9\xE2\x82\xAC"), (std::vector<TokenId>{0xC3, 0xA9, 0xE2, 0x82, 0xAC}));
}

TEST(ByteTokenizerTest, RoundTripsEveryByteValue) {
  ByteTokenizer tok;
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  std::vector<TokenId> ids = *tok.Encode(all);
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[b], b);
  auto decoded = tok.Decode(ids);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(*decoded, all);
}

TEST(ByteTokenizerTest, RoundTripsUtf8Text) {
  ByteTokenizer tok;
  const std::string text = "naïve café — 東京 🚀\n";
  auto decoded = tok.Decode(*tok.Encode(text));
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(*decoded, text);
}

TEST(ByteTokenizerTest, SpecialTokensSkippedByDefault) {
  ByteTokenizer tok;
  std::vector<TokenId> ids = {ByteTokenizer::kBos, 'o', 'k', ByteTokenizer::kEos, ByteTokenizer::kPad};
  auto skipped = tok.Decode(ids);
  ASSERT_TRUE(skipped.ok());
  EXPECT_EQ(*skipped, "ok");
  auto shown = tok.Decode(ids, /*skip_special=*/false);
  ASSERT_TRUE(shown.ok());
  EXPECT_EQ(*shown, "<bos>ok<eos><pad>");
}

TEST(ByteTokenizerTest, OutOfRangeIdIsAnError) {
  ByteTokenizer tok;
  for (TokenId bad : {TokenId{-1}, TokenId{259}, TokenId{100000}}) {
    SCOPED_TRACE(bad);
    auto r = tok.Decode({'a', bad, 'b'});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
    EXPECT_NE(r.status().message().find("token id " + std::to_string(bad)), std::string::npos) << r.status().ToString();
  }
}

TEST(StreamingDecoderTest, HoldsBackACharacterUntilItsLastByte) {
  ByteTokenizer t;
  StreamingDecoder stream(t);
  const std::string emoji = "\xF0\x9F\x98\x80";  // U+1F600, four bytes
  std::vector<std::string> chunks;
  for (unsigned char b : "a" + emoji + "\xC3\xA9") chunks.push_back(*stream.Push(static_cast<TokenId>(b)));
  EXPECT_EQ(chunks, (std::vector<std::string>{"a", "", "", "", emoji, "", "\xC3\xA9"}));
  // A lead byte never finished is handed over by Finish; stray bytes pass at once.
  EXPECT_EQ(*stream.Push(0xE2), "");
  EXPECT_EQ(*stream.Push(0x82), "");
  EXPECT_EQ(stream.Finish(), "\xE2\x82");
  EXPECT_EQ(*stream.Push(0x80), "\x80");
  EXPECT_EQ(*stream.Push(ByteTokenizer::kEos), "");  // special: skipped
  EXPECT_EQ(stream.Push(9999).status().code(), StatusCode::kOutOfRange);
}

TEST(ByteTokenizerTest, InterfaceReportsVocabulary) {
  std::unique_ptr<Tokenizer> tok = std::make_unique<ByteTokenizer>();
  EXPECT_EQ(tok->vocab_size(), 259);
  EXPECT_EQ(tok->pad_id(), 256);
  EXPECT_EQ(tok->bos_id(), 257);
  EXPECT_EQ(tok->eos_id(), 258);
  auto last = tok->Decode({static_cast<TokenId>(tok->vocab_size() - 1)}, /*skip_special=*/false);
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(*last, "<eos>");
}

}  // namespace
}  // namespace sluice::model
