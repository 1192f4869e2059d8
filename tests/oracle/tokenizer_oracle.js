// tokenizer_oracle.js — encodes documents with the npm gpt-3-encoder (the independent
// JavaScript port of OpenAI's encoder.py) for tests/oracle/tokenizer_oracle.py.
//
//   node tokenizer_oracle.js PACKAGE_DIR DOCS
// PACKAGE_DIR is the unpacked package (index.js, Encoder.js, encoder.json, vocab.bpe); DOCS
// holds documents as "<byte count>\n<UTF-8 bytes>". Prints one line of ids per document.
'use strict';
const fs = require('fs');
const path = require('path');

const [pkgDir, docsPath] = process.argv.slice(2);
if (!pkgDir || !docsPath) {
  console.error('usage: node tokenizer_oracle.js PACKAGE_DIR DOCS');
  process.exit(2);
}
const { encode } = require(path.resolve(pkgDir, 'index.js'));
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
  // An id the port failed to find shows up as "undefined" rather than vanishing in join().
  out.push(encode(text).map((x) => (x === undefined ? 'undefined' : String(x))).join(' '));
  pos = nl + 1 + n;
}
process.stdout.write(out.map((l) => l + '\n').join(''));
