// Real gRPC xDS traffic for the tests: released @grpc/grpc-js-xds, no generated code. The same
// commands as grpc_xds.py:
//   backend NAME [HOST]    serves every unary call on HOST:0 (127.0.0.1) answering NAME; prints the port
//   client TARGET          reads lines on stdin:
//     count N [running] [key=value ...]   N calls; prints {backend: answers, "error": n}
//     settle WHO RUN [key=value ...]      calls until WHO answers RUN in a row; prints {settled}
//     callers N M HEADER                  N callers of M calls with HEADER=caller-i each; prints
//                                         {WHO: callers only WHO answered, mixed: n, by: {caller: WHO}}
'use strict';
const grpc = require('@grpc/grpc-js');
const readline = require('readline');

const METHOD = '/dubbo.test.Echo/Who';
const identity = (x) => x;

function backend(name, host) {
  const server = new grpc.Server();
  const definition = {
    Who: {
      path: METHOD, requestStream: false, responseStream: false,
      requestSerialize: identity, requestDeserialize: identity,
      responseSerialize: identity, responseDeserialize: identity,
    },
  };
  server.addService(definition, { Who: (_call, done) => done(null, Buffer.from(name)) });
  server.bindAsync(`${host || '127.0.0.1'}:0`, grpc.ServerCredentials.createInsecure(), (err, port) => {
    if (err) { console.error(err); process.exit(1); }
    console.log(String(port));
  });
  process.stdin.resume();
  process.stdin.on('end', () => server.forceShutdown());
}

function call(client, metadata) {
  return new Promise((resolve) => {
    const md = new grpc.Metadata();
    for (const [key, value] of metadata) md.set(key, value);
    const deadline = new Date(Date.now() + 10000);
    client.makeUnaryRequest(METHOD, identity, identity, Buffer.alloc(0), md, { deadline },
      (err, reply) => resolve(err ? 'error' : reply.toString()));
  });
}

async function clientMain(target) {
  require('@grpc/grpc-js-xds').register();
  const client = new grpc.Client(target, grpc.credentials.createInsecure());
  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    const words = line.trim().split(/\s+/);
    const metadata = words.filter((w) => w.includes('=')).map((w) => {
      const at = w.indexOf('=');
      return [w.slice(0, at), w.slice(at + 1)];
    });
    if (words[0] === 'callers' && words.length === 4) {
      const result = { by: {} };
      for (let i = 0; i < Number(words[1]); i += 1) {
        const caller = `caller-${i}`;
        const answered = new Set();
        for (let j = 0; j < Number(words[2]); j += 1) {
          answered.add(await call(client, [[words[3], caller]]));
        }
        const who = answered.size === 1 ? [...answered][0] : 'mixed';
        result[who] = (result[who] || 0) + 1;
        result.by[caller] = who;
      }
      console.log(JSON.stringify(result));
    } else if (words[0] === 'settle') {
      const wanted = Number(words[2]);
      let calls = 0; let run = 0;
      while (calls < 5000 && run < wanted) {
        calls += 1;
        run = (await call(client, metadata)) === words[1] ? run + 1 : 0;
      }
      console.log(JSON.stringify({ calls, settled: run >= wanted }));
    } else if (words[0] === 'count') {
      const total = Number(words[1]);
      const running = words.includes('running');
      const counts = {};
      for (let i = 0; i < total; i += 1) {
        if (running && i === Math.floor(total / 10)) console.log('running');
        const who = await call(client, metadata);
        counts[who] = (counts[who] || 0) + 1;
      }
      console.log(JSON.stringify(counts));
    } else {
      console.log(JSON.stringify({ error: `bad command ${line}` }));
    }
  }
  client.close();
  process.exit(0);
}

if (process.argv[2] === 'backend') backend(process.argv[3], process.argv[4]);
else clientMain(process.argv[3]);
