// The reference side of bench/tokenizer_bench: the Hugging Face tokenizers
// library (its Rust core through the Node build, npm packages `tokenizers`
// and `tokenizers-linux-x64-gnu`), best of ROUNDS passes, each one
// encodeBatch call over the corpus (one crossing into Rust, not one promise
// per text) with TOKENIZERS_PARALLELISM=false: one thread.
// Prints "MB/s N". Development time only.
//   node bench_reference.mjs MODEL_DIR CORPUS_JSONL ROUNDS   (NODE_PATH: where `tokenizers` is installed)
process.env.TOKENIZERS_PARALLELISM = 'false';
import fs from 'node:fs';
import { createRequire } from 'node:module';
const require = createRequire(process.env.NODE_PATH ? process.env.NODE_PATH + '/' : import.meta.url);
const { Tokenizer } = require('tokenizers');
const [dir, corpusPath, rounds] = process.argv.slice(2);
const texts = fs.readFileSync(corpusPath, 'utf8').split('\n').filter(l => l.length > 0).map(l => JSON.parse(l));
const bytes = texts.reduce((n, t) => n + Buffer.byteLength(t, 'utf8'), 0);
const tok = Tokenizer.fromFile(dir + '/tokenizer.json');
let best = Infinity;
for (let r = 0; r < Number(rounds); r++) {
  const t0 = process.hrtime.bigint();
  await tok.encodeBatch(texts, { addSpecialTokens: false });
  best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
}
console.log(`MB/s ${bytes / best / 1e6}`);
