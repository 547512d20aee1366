// Remove packages from a package.json and its package-lock.json (lockfile v1/v2/v3), so that
// `npm ci` still finds them in sync:   node drop-packages.js DIR NAME...
//
// build.sh kfp-ui uses it for KFP 2.14.3's frontend devDependency `fs@0.0.1-security`: npm's
// placeholder for the core module's name, which the registry no longer serves (GET
// https://registry.npmjs.org/fs/-/fs-0.0.1-security.tgz answers 404 "fs is a core module name").
// The package is empty (a README), nothing in the frontend imports it, and require('fs') is Node's.
const fs = require('fs');
const path = require('path');
const [dir, ...names] = process.argv.slice(2);
const read = f => JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8'));
const write = (f, o) => fs.writeFileSync(path.join(dir, f), JSON.stringify(o, null, 2) + '\n');
const sections = ['dependencies', 'devDependencies', 'optionalDependencies', 'peerDependencies'];
const pkg = read('package.json');
const lock = read('package-lock.json');
for (const name of names) {
  for (const s of sections) {
    if (pkg[s]) delete pkg[s][name];
    if (lock.packages && lock.packages[''] && lock.packages[''][s]) delete lock.packages[''][s][name];
  }
  if (lock.packages) delete lock.packages[`node_modules/${name}`];
  if (lock.dependencies) delete lock.dependencies[name];
}
write('package.json', pkg);
write('package-lock.json', lock);
