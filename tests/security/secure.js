// Released @grpc/grpc-js-xds on both ends of zero trust; the same commands as secure.py:
//   server NAME HOST PORT   an XdsServer with xDS server credentials (plaintext fallback) answering
//                           /shop.Items/{Get,Delete} with {"who": NAME, "peer": SPIFFE ID or ""};
//                           prints "started" once bindAsync was called (it serves when its
//                           listener arrives). RBAC needs GRPC_XDS_EXPERIMENTAL_RBAC=true.
//   client TARGET MODE      MODE "xds" (xDS channel credentials) or "plain"; reads lines:
//     call N METHOD             prints {"OK": n, CODE: n, "peers": {id: n}, "last_error": s}
//     settle OUTCOME RUN METHOD calls until OUTCOME comes RUN times in a row (at most 30 s)
'use strict';
const grpc = require('@grpc/grpc-js');
const xds = require('@grpc/grpc-js-xds');
const readline = require('readline');

const identity = (x) => x;
const METHODS = ['Get', 'Delete'];

function peerId(call) {
  const certificate = call.getAuthContext().sslPeerCertificate;
  const names = (certificate && certificate.subjectaltname) || '';
  const uri = names.split(', ').find((n) => n.startsWith('URI:spiffe://'));
  return uri ? uri.slice(4) : '';
}

function server(name, host, port) {
  // Registers the HTTP filters (router, RBAC) too: without it every listener is NACKed.
  xds.register();
  const server = new xds.XdsServer();
  const definition = {};
  const handlers = {};
  for (const method of METHODS) {
    definition[method] = {
      path: `/shop.Items/${method}`, requestStream: false, responseStream: false,
      requestSerialize: identity, requestDeserialize: identity,
      responseSerialize: identity, responseDeserialize: identity,
    };
    handlers[method] = (call, done) =>
      done(null, Buffer.from(JSON.stringify({ who: name, peer: peerId(call) })));
  }
  server.addService(definition, handlers);
  const credentials = new xds.XdsServerCredentials(grpc.ServerCredentials.createInsecure());
  server.bindAsync(`${host}:${port}`, credentials, (err) => {
    if (err) { console.error(err); process.exit(1); }
  });
  console.log('started');
  process.stdin.resume();
  process.stdin.on('end', () => server.forceShutdown());
}

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

if (process.argv[2] === 'server') server(process.argv[3], process.argv[4], process.argv[5]);
else client(process.argv[3], process.argv[4]);
