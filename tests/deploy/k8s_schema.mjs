// k8s_schema.mjs MODELS_DIR FILE.yaml... — offline schema validation of rendered Kubernetes
// documents (what `kubectl apply --dry-run` would check against an API server's OpenAPI): each
// document of each file is validated with the npm package kubernetes-models (its JSON schemas
// of the Kubernetes API) installed under MODELS_DIR/node_modules, with js-yaml to read them.
// Prints one line per document; exits 1 if any document is invalid or of a kind it has no
// model for, 2 on a usage error.
import fs from "node:fs";
import path from "node:path";

const [modelsDir, ...files] = process.argv.slice(2);
if (!modelsDir || files.length === 0) {
  console.error("usage: k8s_schema.mjs MODELS_DIR FILE.yaml...");
  process.exit(2);
}
const nm = path.join(path.resolve(modelsDir), "node_modules");
const yaml = (await import(path.join(nm, "js-yaml", "index.js"))).default;

// apiVersion "apps/v1" → kubernetes-models/apps/v1; "v1" → kubernetes-models/v1.
async function modelFor(apiVersion, kind) {
  const mod = await import(path.join(nm, "kubernetes-models", apiVersion, "index.js")).catch(() => null);
  return mod && typeof mod[kind] === "function" ? mod[kind] : null;
}

let bad = 0;
for (const file of files) {
  const docs = yaml.loadAll(fs.readFileSync(file, "utf8")).filter((d) => d != null);
  for (const doc of docs) {
    const what = `${path.basename(file)}: ${doc.apiVersion} ${doc.kind} ${doc.metadata?.name ?? "?"}`;
    const Model = await modelFor(doc.apiVersion, doc.kind);
    if (!Model) {
      console.log(`${what}: no schema for this kind`);
      bad++;
      continue;
    }
    // kustomize wraps a Secret's base64 at 70 columns; the API server's decoder (Go's
    // encoding/base64) skips newlines, the schema's "byte" format does not: unwrap first.
    if (doc.kind === "Secret" && doc.data)
      for (const k of Object.keys(doc.data)) doc.data[k] = String(doc.data[k]).replace(/\s+/g, "");
    try {
      new Model(doc).validate();
      console.log(`${what}: valid`);
    } catch (e) {
      console.log(`${what}: INVALID: ${e.message.split("\n")[0]}`);
      bad++;
    }
  }
}
process.exit(bad ? 1 : 0);
