// Encodes texts and text pairs with Hugging Face tokenizers (the reference memfit's tokenizer package is checked
// against). Reads one JSON object from stdin: {"tokenizer": "path/to/tokenizer.json", "max_length": N (0: no
// truncation), "inputs": [["text a", "text b" or null], ...]} and writes one JSON line per input:
// {"ids": [...], "type_ids": [...]}, with the post-processor's special tokens and, when max_length is given,
// truncation=True (longest_first), as transformers' tokenizer(a, b, truncation=True, max_length=N) encodes.
import { readFileSync } from "node:fs";
import tk from "tokenizers";

const req = JSON.parse(readFileSync(0, "utf8"));
const tok = tk.Tokenizer.fromFile(req.tokenizer);
if (req.max_length > 0) {
  tok.setTruncation(req.max_length);
}
const lines = [];
for (const [a, b] of req.inputs) {
  const e = await tok.encode(a, b ?? null);
  lines.push(JSON.stringify({ ids: e.getIds().map(Number), type_ids: e.getTypeIds().map(Number) }));
}
process.stdout.write(lines.join("\n") + "\n");
