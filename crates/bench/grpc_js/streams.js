// The xDS bench's load generator on released @grpc/grpc-js: the same streams as the tonic one
// (crates/bench/src/xds_streams.rs), made through grpc-js's own transport, status mapping and
// reconnection, so a storm's codes are the ones a released gRPC client reports.
//   node streams.js TARGET FIRST STREAMS PER_CONNECTION SERVICES PER_STREAM sotw|delta
// runs streams FIRST.. FIRST+STREAMS-1 of the bench (a stream's number picks its services), so
// several processes can share one run.
// Commands on stdin, one answer line of JSON each:
//   count                  {"endpoint": ACKed load assignments so far}
//   wait WHAT N SECONDS    {"reached": bool, ...} once WHAT reaches N, or after SECONDS: WHAT is
//                          subscribed, endpoint (ACKs), or reconnected (streams whose stream
//                          opened after a failure has ACKed a load assignment and not failed)
//   errors                 {"codes": {"CODE[ reconnecting]": n}, "first": {code: message}}
//   version                {"version": grpc-js's version, as installed}
//   finish                 streams ending from now on are not counted; exits at end of input
'use strict';
const path = require('path');
const readline = require('readline');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const [target, firstStream, streams, perConnection, services, perStream, mode] =
  process.argv.slice(2);
const FIRST = Number(firstStream);
const STREAMS = Number(streams);
const PER_CONNECTION = Number(perConnection);
const SERVICES = Number(services);
const PER_STREAM = Number(perStream);
const DELTA = mode === 'delta';
const CLUSTER = 'type.googleapis.com/envoy.config.cluster.v3.Cluster';
const ENDPOINT = 'type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment';

// Envoy's protos as grpc-js-xds ships them.
const xds = path.dirname(require.resolve('@grpc/grpc-js-xds/package.json'));
const definition = protoLoader.loadSync('envoy/service/discovery/v3/ads.proto', {
  keepCase: true, longs: String, enums: String, defaults: false, oneofs: true,
  includeDirs: ['envoy-api', 'xds', 'googleapis', 'protoc-gen-validate']
    .map((d) => path.join(xds, 'deps', d)),
});
const Ads = grpc.loadPackageDefinition(definition).envoy.service.discovery.v3
  .AggregatedDiscoveryService;

const counts = { subscribed: 0, endpoint: 0, reconnected: 0 };
const codes = {};
const first = {};
let finished = false;
let waiter = null;

function bump(what) {
  counts[what] += 1;
  if (waiter && waiter.what === what && counts[what] >= waiter.wanted) waiter.done(true);
}

function failed(error, state) {
  const code = grpc.status[error.code] || String(error.code);
  const key = state.afterFailure ? `${code} reconnecting` : code;
  codes[key] = (codes[key] || 0) + 1;
  if (!(key in first)) first[key] = String(error.details || error.message).slice(0, 240);
}

const node = { id: 'bench', locality: {} };

function open(client, names, state, id) {
  const call = DELTA ? client.DeltaAggregatedResources() : client.StreamAggregatedResources();
  let ended = false;
  const end = (error) => {
    if (ended) return;
    ended = true;
    if (finished) return;
    failed(error, state);
    // A stream back on the old server before it went is not back.
    if (state.back) { state.back = false; counts.reconnected -= 1; }
    state.afterFailure = true;
    // gRPC's xDS clients: retry at once after a stream that got a response, else back off from
    // 1 s (x1.6, jitter 20 %, at most 120 s).
    const delay = state.gotResponse ? 0 : state.backoff * (0.8 + 0.4 * Math.random());
    if (!state.gotResponse) state.backoff = Math.min(state.backoff * 1.6, 120000);
    state.gotResponse = false;
    setTimeout(() => open(client, names, state, id), delay);
  };
  call.on('error', end);
  call.on('end', () => end({ code: grpc.status.OK, details: 'the server ended the stream' }));
  call.on('data', (response) => {
    state.gotResponse = true;
    state.backoff = 1000;
    if (DELTA) {
      call.write({ type_url: response.type_url, response_nonce: response.nonce });
    } else {
      call.write({
        type_url: response.type_url, resource_names: names,
        version_info: response.version_info, response_nonce: response.nonce,
      });
    }
    if (response.type_url === ENDPOINT) {
      bump('endpoint');
      if (!state.subscribed) { state.subscribed = true; bump('subscribed'); }
      if (state.afterFailure) {
        state.afterFailure = false;
        state.back = true;
        bump('reconnected');
      }
    }
  });
  for (const type of [CLUSTER, ENDPOINT]) {
    call.write(DELTA
      ? { node, type_url: type, resource_names_subscribe: names }
      : { node, type_url: type, resource_names: names });
  }
}

const clients = [];
for (let c = 0; c < Math.ceil(STREAMS / PER_CONNECTION); c += 1) {
  // A channel of its own per client: one HTTP/2 connection each, as separate processes have.
  clients.push(new Ads(target, grpc.credentials.createInsecure(),
    { 'grpc.use_local_subchannel_pool': 1, 'grpc.max_receive_message_length': -1 }));
}
for (let i = FIRST; i < FIRST + STREAMS; i += 1) {
  const names = [0];
  for (let k = 0; k < PER_STREAM; k += 1) names.push(1 + ((i * PER_STREAM + k) % (SERVICES - 1)));
  const clusters = names.map((s) => `outbound|7070||svc-${s}.bench.svc.cluster.local`);
  const state = {
    subscribed: false, afterFailure: false, back: false, gotResponse: false, backoff: 1000,
  };
  open(clients[i % clients.length], clusters, state, i);
}

const answer = (value) => process.stdout.write(`${JSON.stringify(value)}\n`);
const lines = readline.createInterface({ input: process.stdin });
lines.on('line', (line) => {
  const words = line.trim().split(/\s+/);
  if (words[0] === 'count') {
    answer({ endpoint: counts.endpoint });
  } else if (words[0] === 'wait') {
    const [what, wanted, seconds] = [words[1], Number(words[2]), Number(words[3])];
    const timer = setTimeout(() => waiter.done(false), seconds * 1000);
    waiter = {
      what, wanted,
      done: (reached) => {
        clearTimeout(timer);
        waiter = null;
        answer({ reached, [what]: counts[what] });
      },
    };
    if (counts[what] >= wanted) waiter.done(true);
  } else if (words[0] === 'version') {
    answer({ version: require('@grpc/grpc-js/package.json').version });
  } else if (words[0] === 'errors') {
    answer({ codes, first });
  } else if (words[0] === 'finish') {
    finished = true;
  }
});
lines.on('close', () => process.exit(0));
