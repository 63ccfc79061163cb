// Starting and stopping `woq serve` for the Node.js tests.
import { spawn } from 'node:child_process';

// Starts `woq serve -m MODEL --port 0 -t 2 ARGS...`; resolves when it listens.
export async function startServer(woq, model, args) {
  const proc = spawn(woq, ['serve', '-m', model, '--port', '0', '-t', '2', ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`woq serve did not start: ${log}`)), 120000);
    proc.stderr.on('data', (d) => {
      log += d;
      const m = log.match(/on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
    proc.on('exit', (code) => reject(new Error(`woq serve exited with ${code}: ${log}`)));
  });
  return { proc, port, url: `http://127.0.0.1:${port}`, log: () => log };
}

// SIGTERM; resolves with the exit code and signal.
export function stop(server) {
  return new Promise((resolve) => {
    server.proc.removeAllListeners('exit');
    server.proc.on('exit', (code, signal) => resolve({ code, signal }));
    server.proc.kill('SIGTERM');
  });
}
