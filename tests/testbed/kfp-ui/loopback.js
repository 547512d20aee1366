// Preloaded into the KFP UI's Node server (`node -r loopback.js dist/server.js ...`) by the test
// bed: upstream's server listens with `app.listen(port)`, on every interface; this makes every
// listen() that names no host bind KFP_UI_HOST (default 127.0.0.1) instead. Nothing else changes.
const net = require('net');
const host = process.env.KFP_UI_HOST || '127.0.0.1';
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const first = args[0];
  if (typeof first === 'number' || (typeof first === 'string' && /^\d+$/.test(first))) {
    if (typeof args[1] !== 'string') args.splice(1, 0, host);
  } else if (first && typeof first === 'object' && first.host === undefined && first.path === undefined) {
    args[0] = Object.assign({}, first, { host });
  }
  return listen.apply(this, args);
};
