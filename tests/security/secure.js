// Released @grpc/grpc-js-xds's xDS clients, driven by the tests with the same commands as
// secure.py (the servers are the shipped examples/security/server.py and server.js):
//   client TARGET MODE      MODE "xds" (xDS channel credentials) or "plain"; reads lines:
//     call N METHOD             prints {"OK": n, CODE: n, "peers": {id: n}, "last_error": s}
//     settle OUTCOME RUN METHOD calls until OUTCOME comes RUN times in a row (at most 30 s)
'use strict';
const grpc = require('@grpc/grpc-js');
const xds = require('@grpc/grpc-js-xds');
const readline = require('readline');

const identity = (x) => x;

function outcome(client, method) {
  return new Promise((resolve) => {
    const deadline = new Date(Date.now() + 10000);
    client.makeUnaryRequest(method, identity, identity, Buffer.alloc(0), new grpc.Metadata(),
      { deadline }, (err, reply) => {
        if (err) resolve([grpc.status[err.code] || String(err.code), null, err.details]);
        else resolve(['OK', JSON.parse(reply.toString()), null]);
      });
  });
}

async function client(target, mode) {
  xds.register();
  const credentials = mode === 'xds'
    ? new xds.XdsChannelCredentials(grpc.credentials.createInsecure())
    : grpc.credentials.createInsecure();
  const client = new grpc.Client(target, credentials);
  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    const words = line.trim().split(/\s+/);
    if (words[0] === 'call' && words.length === 3) {
      const result = { peers: {} };
      for (let i = 0; i < Number(words[1]); i += 1) {
        const [code, answer, details] = await outcome(client, words[2]);
        result[code] = (result[code] || 0) + 1;
        if (answer) result.peers[answer.peer] = (result.peers[answer.peer] || 0) + 1;
        if (details !== null) result.last_error = details;
      }
      console.log(JSON.stringify(result));
    } else if (words[0] === 'settle' && words.length === 4) {
      let calls = 0; let run = 0; let last = null; let details = null;
      const wanted = Number(words[2]);
      // Bounded in time, not calls: failing calls can be quick, and a configuration takes a
      // moment to reach both ends.
      const deadline = Date.now() + 30000;
      while (Date.now() < deadline && run < wanted) {
        calls += 1;
        [last, , details] = await outcome(client, words[3]);
        run = last === words[1] ? run + 1 : 0;
        if (run === 0) await new Promise((done) => setTimeout(done, 5));
      }
      console.log(JSON.stringify({ calls, settled: run >= wanted, last, details }));
    } else {
      console.log(JSON.stringify({ error: `bad command ${line.trim()}` }));
    }
  }
  client.close();
}

client(process.argv[3], process.argv[4]);
