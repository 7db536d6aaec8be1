// deploy/kubernetes validated offline: every object against its published schema (kubernetes-models for
// the core objects; the InferencePool CRD's openAPIV3Schema of gateway-api-inference-extension v1.5.0 in
// schemas/, with its two CEL rules checked by hand), the objects' references to each other, and the
// endpoint picker's metric names against what `specula serve`, started with the Deployment's own
// arguments, serves on /metrics.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { test } from "node:test";
import Ajv from "ajv";
import yaml from "js-yaml";
import { sourceDir, startServer } from "./harness.mjs";

const deployDir = path.join(sourceDir, "deploy/kubernetes");
const objects = fs.readdirSync(deployDir).filter((f) => f.endsWith(".yaml")).sort().flatMap((f) =>
  yaml.loadAll(fs.readFileSync(path.join(deployDir, f), "utf8")).filter(Boolean).map((o) => ({ file: f, ...o })));
const find = (kind, name) => {
  const o = objects.find((x) => x.kind === kind && x.metadata?.name === name);
  assert.ok(o, `deploy/kubernetes has a ${kind} named ${name}`);
  return o;
};
const strip = ({ file, ...o }) => o;

const crd = yaml.load(fs.readFileSync(path.join(path.dirname(fileURLToPath(import.meta.url)), "schemas/inference.networking.k8s.io_inferencepools-v1.5.0.yaml"), "utf8"));
const poolSchema = crd.spec.versions.find((v) => v.name === "v1").schema.openAPIV3Schema;
// strict: false lets the Kubernetes extensions (x-kubernetes-*) through; they are checked below.
const validatePool = new Ajv({ strict: false, allErrors: true, validateFormats: false }).compile(poolSchema);

function validateInferencePool(o) {
  if (!validatePool(o)) throw new Error(JSON.stringify(validatePool.errors));
  const ref = o.spec.endpointPickerRef;
  if ((ref.kind ?? "Service") === "Service" && !ref.port) throw new Error("port is required when kind is 'Service'");
  const numbers = o.spec.targetPorts.map((p) => p.number);
  if (new Set(numbers).size !== numbers.length) throw new Error("port number must be unique");
}

// kubernetes-models lays its classes out as GROUP/VERSION/KIND (the core group as VERSION/KIND).
async function validateCore(o) {
  const Model = (await import(`kubernetes-models/${o.apiVersion}/${o.kind}`))[o.kind];
  new Model(o).validate();
}

async function validate(o) {
  if (o.apiVersion === "inference.networking.k8s.io/v1" && o.kind === "InferencePool") return validateInferencePool(o);
  return validateCore(o);
}

test("every object is valid against its schema", async () => {
  assert.ok(objects.length >= 9, `the manifests hold the server and the gateway objects (${objects.length})`);
  for (const o of objects) {
    await assert.doesNotReject(validate(strip(o)), `${o.file}: ${o.kind} ${o.metadata?.name}`);
  }
});

test("the validators reject broken objects", async () => {
  const broken = (o, edit) => { const c = structuredClone(strip(o)); edit(c); return validate(c); };
  const server = find("Deployment", "specula");
  await assert.rejects(broken(server, (c) => { c.spec.template.spec.containers[0].ports[0].containerPort = "eighty"; }));
  await assert.rejects(broken(server, (c) => { delete c.spec.selector; }));
  const pool = find("InferencePool", "specula");
  await assert.rejects(broken(pool, (c) => { delete c.spec.endpointPickerRef; }));
  await assert.rejects(broken(pool, (c) => { c.spec.targetPorts.push({ number: c.spec.targetPorts[0].number }); }));
  await assert.rejects(broken(pool, (c) => { delete c.spec.endpointPickerRef.port; }));
  await assert.rejects(broken(pool, (c) => { c.spec.targetPorts = [{ number: 70000 }]; }));
});

const server = find("Deployment", "specula");
const pod = server.spec.template;
const container = pod.spec.containers[0];
const matches = (selector, labels) => Object.entries(selector).every(([k, v]) => labels[k] === v);

test("the Service, the pool and the probes reach the server's pods and port", () => {
  const portNumber = (name) => container.ports.find((p) => p.name === name || p.containerPort === name)?.containerPort;
  assert.ok(matches(server.spec.selector.matchLabels, pod.metadata.labels));
  const svc = find("Service", "specula");
  assert.ok(matches(svc.spec.selector, pod.metadata.labels));
  assert.ok(portNumber(svc.spec.ports[0].targetPort));
  for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"]) {
    assert.equal(container[probe].httpGet.path, "/health", probe);
    assert.equal(portNumber(container[probe].httpGet.port), 8080, probe);
  }
  const pool = find("InferencePool", "specula");
  assert.ok(matches(pool.spec.selector.matchLabels, pod.metadata.labels));
  assert.deepEqual(pool.spec.targetPorts.map((p) => p.number), [portNumber("http")]);
  const arg = (flag) => container.args[container.args.indexOf(flag) + 1];
  assert.equal(arg("--host"), "0.0.0.0", "the server listens on the pod's address");
  // On the pod's address, the API key is required; it comes from a Secret, never from the arguments.
  const key = container.env.find((e) => e.name === "SPECULA_API_KEY");
  assert.ok(key?.valueFrom?.secretKeyRef?.name && key.valueFrom.secretKeyRef.key, "SPECULA_API_KEY from a Secret");
  assert.ok(!container.args.includes("--api-key"), "no key in the arguments (they show in ps and in the pod spec)");
  assert.equal(Number(arg("--port")), portNumber("http"));

  const epp = find("Deployment", "specula-epp");
  const eppSvc = find("Service", pool.spec.endpointPickerRef.name);
  assert.ok(eppSvc.spec.ports.some((p) => p.port === pool.spec.endpointPickerRef.port.number));
  assert.ok(matches(eppSvc.spec.selector, epp.spec.template.metadata.labels));
  const args = epp.spec.template.spec.containers[0].args;
  assert.equal(args[args.indexOf("--pool-name") + 1], pool.metadata.name);
  const role = find("Role", "specula-epp");
  assert.ok(role.rules.some((r) => r.resources.includes("pods") && r.verbs.includes("watch")));
  assert.ok(role.rules.some((r) => r.apiGroups.includes("inference.networking.k8s.io") && r.resources.includes("inferencepools")));
  assert.equal(find("RoleBinding", "specula-epp").subjects[0].name, epp.spec.template.spec.serviceAccountName);
});

// The endpoint picker's configuration, read the way the EPP reads it: the ConfigMap key its --config-file names.
function eppConfig() {
  const epp = find("Deployment", "specula-epp").spec.template.spec;
  const args = epp.containers[0].args;
  const file = args[args.indexOf("--config-file") + 1];
  const mount = epp.containers[0].volumeMounts.find((m) => file.startsWith(m.mountPath + "/"));
  assert.ok(mount, `--config-file ${file} lies in a mounted volume`);
  const cm = find("ConfigMap", epp.volumes.find((v) => v.name === mount.name).configMap.name);
  const key = file.slice(mount.mountPath.length + 1);
  assert.ok(cm.data[key], `ConfigMap ${cm.metadata.name} has the key ${key}`);
  return yaml.load(cm.data[key]);
}

// The server started with the Deployment's own arguments, on a free loopback port instead of 0.0.0.0:8080.
async function startAsDeployed() {
  const args = container.args.slice(1);
  for (const flag of ["--host", "--port"]) args.splice(args.indexOf(flag), 2);
  return startServer(args);
}

test("the endpoint picker maps Specula's metrics, and /metrics serves them as gauges", async () => {
  const config = eppConfig();
  assert.equal(config.apiVersion, "inference.networking.x-k8s.io/v1alpha1");
  assert.equal(config.kind, "EndpointPickerConfig");
  const types = new Set(config.plugins.map((p) => p.name ?? p.type));
  for (const profile of config.schedulingProfiles) for (const p of profile.plugins) assert.ok(types.has(p.pluginRef), p.pluginRef);
  for (const s of config.data.sources) {
    assert.ok(types.has(s.pluginRef), s.pluginRef);
    for (const e of s.extractors) assert.ok(types.has(e.pluginRef), e.pluginRef);
  }
  const extractor = config.plugins.find((p) => p.type === "core-metrics-extractor").parameters;
  const engine = extractor.engineConfigs.find((e) => e.name === extractor.defaultEngine);
  assert.ok(engine, `an engineConfigs entry for the default engine ${extractor.defaultEngine}`);
  assert.equal(pod.metadata.labels[extractor.engineLabelKey ?? "inference.networking.k8s.io/engine-type"], engine.name);

  const live = await startAsDeployed();
  let text;
  try {
    assert.equal((await fetch(`${live.url}/health`)).status, 200);
    text = await (await fetch(`${live.url}/metrics`)).text();
  } finally {
    assert.equal(await live.stop(), 0, "specula serve exits 0 on SIGTERM");
  }
  for (const spec of ["queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec"]) {
    const name = engine[spec];
    assert.match(text, new RegExp(`^# TYPE ${name} gauge$`, "m"), `${spec}: /metrics serves ${name} as a gauge`);
    const value = Number(text.match(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, "m"))?.[1]);
    assert.ok(Number.isFinite(value) && value >= 0, `${name} has a value: ${value}`);
    if (spec === "kvUsageSpec") assert.ok(value <= 1, `${name} is a fraction: ${value}`);
  }
  for (const spec of ["loraSpec", "cacheInfoSpec"]) assert.equal(engine[spec], "", `${spec} is off: Specula has no such metric`);
});
