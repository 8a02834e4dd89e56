// Makes the edge-case reference encodings in this folder with the Hugging Face tokenizers library for Node
// (the Rust core, the same version as ../shared/data/tokenizers/*/golden.jsonl):
//
//   cd /tmp && npm install tokenizers@0.23.2
//   NODE_PATH=/tmp/node_modules node tokenizer/testdata/make_refs.js tokenizer/testdata \
//     llama3=../shared/data/tokenizers/llama3 mistral=../shared/data/tokenizers/mistral \
//     bert-base-uncased=../shared/data/tokenizers/bert-base-uncased memfit-bpe4k=pretrained/llama-tiny
//
// For each tokenizer it writes <name>.edge.jsonl: {"text", "ids" (special tokens added), "decoded" (special
// tokens skipped)} per string, the same fields as golden.jsonl.
const { Tokenizer } = require('tokenizers');
const fs = require('fs');
const path = require('path');

const [out, ...named] = process.argv.slice(2);
const long = 'pneumonoultramicroscopicsilicovolcanoconiosis'.repeat(8);
const texts = [
  ' ', '  ', '\n', '\n\n\n', ' \n ', '\t\t', 'a  b   c    d', 'trailing   ', '   leading',
  'line one\nline two\r\nline three\n\n\nend', 'tabs\tin\tthe\tmiddle',
  "It's can't won't they'll I'd we've you're I'M HE'S",
  'Ünïcödé ßtraße Ελληνικά русский язык العربية עברית हिन्दी ไทย',
  '中文字符和日本語のテキストと한국어', '🦙🚀👩‍👩‍👧‍👦 🇫🇷 ❤️‍🔥 emoji!!!', '\u200b\u200d zero width\u00a0nbsp',
  'combining e\u0301 vs \u00e9', 'math: ∑∫√∞ ≤ ≥ ≠ ± × ÷', 'code: for (i = 0; i < n; i++) { x[i] += 1; }',
  'numbers 1 12 123 1234 12345 123456 3.14159 -42 1e10 0x1F',
  'URL https://example.com/a/b?c=d&e=f#g and email a.b@c.de', '<s> </s> <unk> [CLS] [SEP] [PAD] [MASK]',
  '<|begin_of_text|>Hello<|end_of_text|> <|eot_id|>', 'A', 'a', '.', '...', '?!?!', '""\'\'``',
  long, 'word' + long + ' ' + long.toUpperCase(), 'MiXeD CaSe WoRdS', '    indented code\n        more',
  '%$#@!^&*()_+-=[]{}|;:,./<>?~', 'Don\'t   stop\n  believing  ',
];
for (const arg of named) {
  const [name, dir] = arg.split('=');
  const file = path.join(dir, 'tokenizer.json');
  const tok = Tokenizer.fromFile(file);
  const lines = [];
  (async () => {
    for (const text of texts) {
      const enc = await tok.encode(text);
      const ids = enc.getIds();
      const decoded = await tok.decode(ids, true);
      lines.push(JSON.stringify({ text, ids, decoded }));
    }
    fs.writeFileSync(path.join(out, name + '.edge.jsonl'), lines.join('\n') + '\n');
    console.log(name, lines.length);
  })();
}
