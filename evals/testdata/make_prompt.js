// Writes the 5-shot MMLU prompt of the first abstract_algebra test question, built the way
// lm-evaluation-harness' mmlu task does (description, then doc_to_text + target_delimiter " " + letter per
// shot joined by fewshot_delimiter "\n\n", then the question's doc_to_text), independently of memfit's Go code:
//
//   node evals/testdata/make_prompt.js ../shared/data/mmlu > evals/testdata/abstract_algebra_5shot_q0.txt
const fs = require('fs');
const path = require('path');
function parseCSV(text) {
  const rows = []; let row = []; let field = ''; let quoted = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (quoted) {
      if (c === '"' && text[i + 1] === '"') { field += '"'; i++; } else if (c === '"') { quoted = false; } else { field += c; }
    } else if (c === '"') { quoted = true; } else if (c === ',') { row.push(field); field = ''; }
    else if (c === '\n') { row.push(field); rows.push(row); row = []; field = ''; }
    else if (c !== '\r') { field += c; }
  }
  if (field !== '' || row.length) { row.push(field); rows.push(row); }
  return rows;
}
const dir = process.argv[2];
const subject = 'abstract_algebra';
const dev = parseCSV(fs.readFileSync(path.join(dir, 'dev', subject + '_dev.csv'), 'utf8')).slice(1);
const test = parseCSV(fs.readFileSync(path.join(dir, 'test', subject + '_test.csv'), 'utf8')).slice(1);
const letters = ['A', 'B', 'C', 'D'];
const docToText = (r) => `${r[0].trim()}\nA. ${r[1]}\nB. ${r[2]}\nC. ${r[3]}\nD. ${r[4]}\nAnswer:`;
const description = `The following are multiple choice questions (with answers) about ${subject.replace(/_/g, ' ')}.\n\n`;
const shots = dev.slice(0, 5).map((r) => docToText(r) + ' ' + letters[Number(r[5])]);
process.stdout.write(description + shots.join('\n\n') + '\n\n' + docToText(test[0]));
