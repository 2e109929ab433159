'use strict';
// Loopback ports for the servers that tests and benchmarks start. No side effects on
// require (unlike processes.js, which installs exit and signal handlers), so the soak
// and the peer benchmarks can share it.

const net = require('node:net');

/** A loopback TCP port that was free a moment ago (the callers retry when it is taken). */
function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.unref();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

module.exports = { freePort };
