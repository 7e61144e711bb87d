// docs/security.md's greeter on released @grpc/grpc-js-xds: an XdsServer that takes its TLS and
// RBAC from dubbo-cp, answering every unary method of org.example.Greeter (SayHello, Delete) with
// its name and the caller's SPIFFE ID. No generated code.
//
//   node server.js HOST PORT NAME   serves until stopped; the bootstrap comes from
//                                   GRPC_XDS_BOOTSTRAP_CONFIG (dubbo-cp bootstrap, reaching the
//                                   control plane through the agent's --xds-proxy)
'use strict';
const grpc = require('@grpc/grpc-js');
const xds = require('@grpc/grpc-js-xds');

// Registers the xDS resolver and the HTTP filters (router, RBAC): without it the server knows
// no filter and NACKs every listener it is sent.
xds.register();

const identity = (x) => x;

function peerId(call) {
  const certificate = call.getAuthContext().sslPeerCertificate;
  const names = (certificate && certificate.subjectaltname) || '';
  const uri = names.split(', ').find((n) => n.startsWith('URI:spiffe://'));
  return uri ? uri.slice(4) : '';
}

const [host, port, name] = process.argv.slice(2);
if (!name) {
  console.error('usage: node server.js HOST PORT NAME');
  process.exit(2);
}
const server = new xds.XdsServer();
const definition = {};
const handlers = {};
for (const method of ['SayHello', 'Delete']) {
  definition[method] = {
    path: `/org.example.Greeter/${method}`, requestStream: false, responseStream: false,
    requestSerialize: identity, requestDeserialize: identity,
    responseSerialize: identity, responseDeserialize: identity,
  };
  handlers[method] = (call, done) =>
    done(null, Buffer.from(JSON.stringify({ who: name, peer: peerId(call) })));
}
server.addService(definition, handlers);
// xDS server credentials: TLS when the control plane says so (STRICT), else plaintext.
const credentials = new xds.XdsServerCredentials(grpc.ServerCredentials.createInsecure());
server.bindAsync(`${host}:${port}`, credentials, (err) => {
  if (err) { console.error(err); process.exit(1); }
});
console.log(`greeter ${name} started on ${host}:${port}`);
