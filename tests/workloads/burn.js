// Test workload: two named hot functions; hotHeavy does 3x the work of hotLight per call.
// Run: node --perf-basic-prof --no-turbo-inlining burn.js SECONDS [MIN_LIGHT_S CAP_S]
// It runs SECONDS, and on until hotLight has had MIN_LIGHT_S of CPU time (a slow or loaded
// machine gives it less per second), for at most CAP_S.
// At exit it prints the CPU time spent in each function ("time_s HEAVY LIGHT": the process's
// CPU clock around each call, as Node 20 has no per-thread one; V8's helper threads are idle
// while this loop runs): the compiled code of the two need not run exactly 3:1 in time, so
// that is the truth to check.
'use strict';
function hotHeavy(n) {
  let x = 1;
  for (let i = 0; i < 3 * n; i++) {
    x = (Math.imul(x, 1103515245) + 12345) | 0;
  }
  return x;
}
function hotLight(n) {
  let x = 1;
  for (let i = 0; i < n; i++) {
    x = (Math.imul(x, 1103515245) + 12345) | 0;
  }
  return x;
}
const seconds = Number(process.argv[2] || 2);
const minLightUs = Number(process.argv[3] || 0) * 1e6;
const start = Date.now();
const end = start + seconds * 1000;
const cap = start + Number(process.argv[4] || seconds) * 1000;
// Process CPU time (user + system) in microseconds.
function cpuUs() {
  const u = process.cpuUsage();
  return u.user + u.system;
}
let heavyUs = 0;
let lightUs = 0;
let acc = 0;
while ((Date.now() < end || lightUs < minLightUs) && Date.now() < cap) {
  const t0 = cpuUs();
  acc ^= hotHeavy(300000);
  const t1 = cpuUs();
  acc ^= hotLight(300000);
  const t2 = cpuUs();
  heavyUs += t1 - t0;
  lightUs += t2 - t1;
}
console.log(acc);
console.log(`time_s ${heavyUs / 1e6} ${lightUs / 1e6}`);
