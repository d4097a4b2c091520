// Test workload: two named hot functions; hotHeavy does 3x the work of hotLight per call.
// Run: node --perf-basic-prof --no-turbo-inlining burn.js SECONDS
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
const end = Date.now() + seconds * 1000;
let acc = 0;
while (Date.now() < end) {
  acc ^= hotHeavy(300000);
  acc ^= hotLight(300000);
}
console.log(acc);
