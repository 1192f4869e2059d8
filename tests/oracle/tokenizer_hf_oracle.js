// tokenizer_hf_oracle.js — encodes documents with npm @huggingface/tokenizers (Hugging Face's
// own JavaScript implementation of tokenizer.json) for tests/oracle/tokenizer_hf_oracle.py.
//
//   node tokenizer_hf_oracle.js PACKAGE_DIR TOKENIZER_JSON DOCS
// PACKAGE_DIR is the unpacked package (dist/tokenizers.cjs); DOCS holds documents as
// "<byte count>\n<UTF-8 bytes>". Prints one line per document: its ids (encoded without
// special tokens added), a tab, and 1 when decode(ids) gives the document back, else 0.
'use strict';
const fs = require('fs');
const path = require('path');

const [pkgDir, tokPath, docsPath] = process.argv.slice(2);
if (!pkgDir || !tokPath || !docsPath) {
  console.error('usage: node tokenizer_hf_oracle.js PACKAGE_DIR TOKENIZER_JSON DOCS');
  process.exit(2);
}
const { Tokenizer } = require(path.resolve(pkgDir, 'dist', 'tokenizers.cjs'));
const tok = new Tokenizer(JSON.parse(fs.readFileSync(tokPath, 'utf8')), {});
const buf = fs.readFileSync(docsPath);
const out = [];
let pos = 0;
while (pos < buf.length) {
  const nl = buf.indexOf(0x0a, pos);
  const n = parseInt(buf.toString('latin1', pos, nl), 10);
  if (nl < 0 || !(n >= 0) || nl + 1 + n > buf.length) {
    console.error(`${docsPath}: bad document header at byte ${pos}`);
    process.exit(1);
  }
  const text = buf.toString('utf8', nl + 1, nl + 1 + n);
  const ids = tok.encode(text, { add_special_tokens: false }).ids;
  const back = tok.decode(ids) === text ? 1 : 0;
  out.push(ids.map((x) => (x === undefined ? 'undefined' : String(x))).join(' ') + '\t' + back);
  pos = nl + 1 + n;
}
process.stdout.write(out.map((l) => l + '\n').join(''));
