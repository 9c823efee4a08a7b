//! The OpenAPI 3 document of the control plane's HTTP API (`GET /v1/openapi.json`).
//!
//! Written by hand next to the route table in `api.rs`; a test checks that both list the same
//! routes with the same guard, and that every schema reference resolves.

use serde_json::{Value, json};

fn error_response(description: &str) -> Value {
    json!({
        "description": description,
        "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ErrorBody" } } }
    })
}

fn json_response(description: &str, schema: &str) -> Value {
    json!({
        "description": description,
        "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{schema}") } } }
    })
}

fn json_request(schema: &str) -> Value {
    json!({
        "required": true,
        "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{schema}") } } }
    })
}

/// The answers every guarded route may give besides its own.
fn guarded(mut responses: Value) -> Value {
    if let Some(map) = responses.as_object_mut() {
        map.insert("401".into(), error_response("missing or wrong token"));
        map.insert(
            "500".into(),
            error_response("internal error (details in the server log)"),
        );
    }
    responses
}

fn apply_operation(summary: &str) -> Value {
    json!({
        "summary": summary,
        "operationId": if summary.starts_with("Create") { "postDag" } else { "putDag" },
        "tags": ["dags"],
        "parameters": [{
            "name": "file", "in": "query", "required": false,
            "description": "the file name errors should show (default: `request body`)",
            "schema": { "type": "string", "maxLength": 256 }
        }],
        "requestBody": {
            "required": true,
            "description": "the DAG file (interfaces.md section 1)",
            "content": {
                "application/yaml": { "schema": { "type": "string" } },
                "text/plain": { "schema": { "type": "string" } }
            }
        },
        "responses": guarded(json!({
            "201": json_response("created", "DagSummary"),
            "200": json_response("updated, or unchanged (same text)", "DagSummary"),
            "400": {
                "description": "the file is not a valid DAG: where and why",
                "content": { "application/json": { "schema": { "$ref": "#/components/schemas/DagErrorBody" } } }
            },
            "413": error_response("body over the size limit"),
            "415": error_response("not a YAML or text body")
        }))
    })
}

/// The whole document.
pub fn document() -> Value {
    let name_param = json!({
        "name": "name", "in": "path", "required": true,
        "schema": { "type": "string", "pattern": "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$" }
    });
    let id_param = json!({
        "name": "id", "in": "path", "required": true,
        "schema": { "type": "string", "pattern": "^[A-Za-z0-9._-]{1,64}$" }
    });
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "Sonic control plane",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "DAG and agent registry of the Sonic serverless DAG orchestrator. Every route but /v1/health requires `Authorization: Bearer <token>`. Errors are JSON `{\"error\": \"...\"}`."
        },
        "security": [ { "bearer": [] } ],
        "paths": {
            "/v1/health": {
                "get": {
                    "summary": "Liveness of the control plane and its database",
                    "operationId": "health",
                    "tags": ["system"],
                    "security": [],
                    "responses": {
                        "200": json_response("up", "ControlHealth"),
                        "503": json_response("the database does not answer", "ControlHealth")
                    }
                }
            },
            "/v1/openapi.json": {
                "get": {
                    "summary": "This document",
                    "operationId": "openapi",
                    "tags": ["system"],
                    "responses": guarded(json!({
                        "200": { "description": "OpenAPI 3 document", "content": { "application/json": { "schema": { "type": "object" } } } }
                    }))
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics (text format 0.0.4)",
                    "operationId": "metrics",
                    "tags": ["system"],
                    "responses": guarded(json!({
                        "200": { "description": "requests, jobs, stages, instances, data passing, planning, prediction error, queue, capacity, store retries (docs/api.md, Metrics)", "content": { "text/plain": { "schema": { "type": "string" } } } }
                    }))
                }
            },
            "/v1/dags": {
                "get": {
                    "summary": "List the DAGs",
                    "operationId": "listDags",
                    "tags": ["dags"],
                    "responses": guarded(json!({ "200": json_response("every DAG, by name", "DagList") }))
                },
                "put": apply_operation("Apply a DAG file (create or update)"),
                "post": apply_operation("Create or update a DAG file (same as PUT)")
            },
            "/v1/dags/{name}": {
                "get": {
                    "summary": "One DAG: summary, the file as applied, and the checked DAG",
                    "operationId": "getDag",
                    "tags": ["dags"],
                    "parameters": [name_param.clone()],
                    "responses": guarded(json!({
                        "200": json_response("the DAG", "DagDetail"),
                        "400": error_response("not a valid DAG name"),
                        "404": error_response("no such DAG")
                    }))
                },
                "delete": {
                    "summary": "Remove a DAG's definition (its jobs, samples and models stay)",
                    "operationId": "deleteDag",
                    "tags": ["dags"],
                    "parameters": [name_param.clone()],
                    "responses": guarded(json!({
                        "204": { "description": "deleted" },
                        "400": error_response("not a valid DAG name"),
                        "404": error_response("no such DAG")
                    }))
                }
            },
            "/v1/dags/{name}/models": {
                "get": {
                    "summary": "What online profiling learned: per parameter the fitted equation, its cross-validated MAPE, its samples; whether the DAG converged (its jobs then run planned)",
                    "operationId": "getDagModels",
                    "tags": ["dags"],
                    "parameters": [name_param.clone()],
                    "responses": guarded(json!({
                        "200": json_response("the models (empty equations before the first job)", "DagModelsView"),
                        "400": error_response("not a valid DAG name"),
                        "404": error_response("no such DAG, and no models of that name")
                    }))
                }
            },
            "/v1/dags/{name}/plan": {
                "get": {
                    "summary": "The plan for a job of a given input size, from the fitted models and the measured bandwidths (the `ofctl plan -o json` document)",
                    "operationId": "getDagPlan",
                    "tags": ["dags"],
                    "parameters": [name_param, {
                        "name": "input_bytes", "in": "query", "required": true,
                        "description": "the job input size to plan for",
                        "schema": { "type": "integer", "format": "int64", "minimum": 0 }
                    }, {
                        "name": "policy", "in": "query", "required": false,
                        "schema": { "type": "string", "enum": ["sonic", "remote", "local", "direct"], "default": "sonic" }
                    }],
                    "responses": guarded(json!({
                        "200": json_response("the plan", "PlanReport"),
                        "400": error_response("not a valid DAG name, input_bytes missing, or an unknown policy"),
                        "404": error_response("no such DAG"),
                        "409": error_response("the models cannot predict yet (a parameter was never measured)"),
                        "422": error_response("no plan is possible (the DAG's bounds, memory no VM type offers)")
                    }))
                }
            },
            "/v1/agents": {
                "get": {
                    "summary": "List the agents with their liveness",
                    "operationId": "listAgents",
                    "tags": ["agents"],
                    "responses": guarded(json!({ "200": json_response("every agent, by id", "AgentList") }))
                }
            },
            "/v1/agents/register": {
                "post": {
                    "summary": "Register (or re-register) an agent: the join token (or the API token) opens it; the answer hands a joining agent its token, the file key and the store",
                    "operationId": "registerAgent",
                    "tags": ["agents"],
                    "requestBody": json_request("Capacity"),
                    "responses": guarded(json!({
                        "200": json_response("registered", "Joined"),
                        "400": error_response("invalid JSON, agent id, URL or VM type"),
                        "413": error_response("body over the size limit")
                    }))
                }
            },
            "/v1/agents/{id}/heartbeat": {
                "post": {
                    "summary": "An agent's heartbeat (the join token or the API token opens it)",
                    "operationId": "heartbeat",
                    "tags": ["agents"],
                    "parameters": [id_param],
                    "requestBody": json_request("Heartbeat"),
                    "responses": guarded(json!({
                        "200": json_response("recorded", "AgentInfo"),
                        "400": error_response("invalid JSON, or the body's agent_id differs from the path"),
                        "404": error_response("unknown agent: register again"),
                        "413": error_response("body over the size limit")
                    }))
                }
            },
            "/v1/agents/{id}/runs/{run_id}/report": {
                "post": {
                    "summary": "An agent pushes the report of a run that ended, to the executor waiting for it (the agents' token, the join token or the API token opens it)",
                    "operationId": "reportRun",
                    "tags": ["agents"],
                    "parameters": [
                        id_param.clone(),
                        { "name": "run_id", "in": "path", "required": true, "schema": { "type": "string", "maxLength": 512 } }
                    ],
                    "requestBody": json_request("RunReport"),
                    "responses": guarded(json!({
                        "204": { "description": "taken: the waiting executor has the report" },
                        "400": error_response("invalid JSON, agent id or run id; the body's run_id differs from the path; status running"),
                        "403": error_response("the run was sent to another agent"),
                        "404": error_response("no run of that id waits for a report (unknown, stale attempt, already reported), or the control plane runs no jobs"),
                        "413": error_response("body over the size limit")
                    }))
                }
            },
            "/v1/jobs": {
                "get": {
                    "summary": "List jobs, newest first",
                    "operationId": "listJobs",
                    "tags": ["jobs"],
                    "parameters": [
                        { "name": "dag", "in": "query", "required": false, "schema": { "type": "string" } },
                        { "name": "limit", "in": "query", "required": false, "schema": { "type": "integer", "maximum": 1000 } }
                    ],
                    "responses": guarded(json!({
                        "200": json_response("jobs", "JobList"),
                        "400": error_response("bad query")
                    }))
                },
                "post": {
                    "summary": "Submit a job: run a DAG on an input",
                    "operationId": "submitJob",
                    "tags": ["jobs"],
                    "requestBody": json_request("SubmitJob"),
                    "responses": guarded(json!({
                        "202": json_response("accepted; follow it with GET /v1/jobs/{id}", "JobAccepted"),
                        "400": error_response("invalid JSON, policy, parameters or input"),
                        "404": error_response("no such DAG"),
                        "409": error_response("policy sonic forced, but the DAG's models cannot predict yet"),
                        "422": error_response("policy sonic forced, but no plan is possible"),
                        "413": error_response("body over the size limit"),
                        "503": error_response("this control plane runs no jobs (no object store)")
                    }))
                }
            },
            "/v1/jobs/{id}": {
                "get": {
                    "summary": "A job: its state, and its summary once it ended",
                    "operationId": "getJob",
                    "tags": ["jobs"],
                    "parameters": [id_param.clone()],
                    "responses": guarded(json!({
                        "200": json_response("the job", "JobSummary"),
                        "400": error_response("not a job id"),
                        "404": error_response("no such job")
                    }))
                }
            },
            "/v1/jobs/{id}/cancel": {
                "post": {
                    "summary": "Cancel a queued or running job",
                    "operationId": "cancelJob",
                    "tags": ["jobs"],
                    "parameters": [id_param.clone()],
                    "responses": guarded(json!({
                        "202": json_response("cancel requested", "JobSummary"),
                        "400": error_response("not a job id, or the job already ended"),
                        "404": error_response("no such job")
                    }))
                }
            },
            "/v1/jobs/{id}/results/{*key}": {
                "get": {
                    "summary": "Download one result object of a job (an `outputs` entry, by its path under the job's result/)",
                    "operationId": "getJobResult",
                    "tags": ["jobs"],
                    "parameters": [id_param.clone(), {
                        "name": "key", "in": "path", "required": true,
                        "description": "the object's path under `jobs/<id>/result/`, slashes included",
                        "schema": { "type": "string" }
                    }],
                    "responses": guarded(json!({
                        "200": { "description": "the object's bytes", "content": { "application/octet-stream": { "schema": { "type": "string", "format": "binary" } } } },
                        "400": error_response("not a job id, or an invalid key"),
                        "404": error_response("no such job or result"),
                        "503": error_response("this control plane runs no jobs (no object store)")
                    }))
                }
            },
            "/v1/jobs/{id}/events": {
                "get": {
                    "summary": "The job's progress as server-sent events: each `data:` line is one JobEvent; the first is its state now, the stream ends after the event with a terminal status",
                    "operationId": "getJobEvents",
                    "tags": ["jobs"],
                    "parameters": [id_param.clone()],
                    "responses": guarded(json!({
                        "200": {
                            "description": "text/event-stream of JobEvent (keep-alive comments in between)",
                            "content": { "text/event-stream": { "schema": { "$ref": "#/components/schemas/JobEvent" } } }
                        },
                        "400": error_response("not a job id"),
                        "404": error_response("no such job")
                    }))
                }
            },
            "/v1/jobs/{id}/logs": {
                "get": {
                    "summary": "What every instance attempt of the job wrote (standard output and error, as kept by its agent)",
                    "operationId": "getJobLogs",
                    "tags": ["jobs"],
                    "parameters": [id_param, {
                        "name": "function", "in": "query", "required": false,
                        "description": "only this function's instances",
                        "schema": { "type": "string" }
                    }],
                    "responses": guarded(json!({
                        "200": json_response("the logs, by function, instance and attempt", "JobLogs"),
                        "400": error_response("not a job id or function name"),
                        "404": error_response("no such job")
                    }))
                }
            }
        },
        "components": {
            "securitySchemes": {
                "bearer": { "type": "http", "scheme": "bearer" }
            },
            "schemas": schemas()
        }
    })
}

fn schemas() -> Value {
    let int = json!({ "type": "integer", "format": "int64" });
    let time = json!({ "type": "integer", "format": "int64", "description": "Unix milliseconds" });
    let mut all = main_schemas(&int, &time);
    // Apart: one json! of every schema exceeds the macro's recursion limit.
    all["DagModeView"] = json!({
        "type": "object", "required": ["mode", "reason", "since_ms", "drifts", "watch", "drift_error", "drift_jobs"],
        "description": "how the DAG's unforced jobs run: profiling until its models converge, then planned until a drift",
        "properties": {
            "mode": { "type": "string", "enum": ["profiling", "planned"] },
            "reason": { "type": "string", "description": "why; a drift names the parameter, its measured and predicted values and the jobs" },
            "since_ms": int.clone(),
            "since_job": { "type": "string", "description": "the job whose sample changed the mode" },
            "fitted_from": { "type": "string", "description": "after a drift: the models are fitted on this job's sample and later ones" },
            "drifts": { "type": "integer" },
            "watch": { "type": "array", "items": { "type": "object", "required": ["parameter", "predicted", "measured", "error", "jobs"],
                "properties": { "parameter": { "type": "string" }, "predicted": { "type": "number" }, "measured": { "type": "number" },
                                "error": { "type": "number" }, "jobs": { "type": "integer" } } },
                "description": "parameters off their prediction in the latest planned jobs" },
            "drift_error": { "type": "number", "description": "relative error beyond which a parameter is off" },
            "drift_jobs": { "type": "integer", "description": "consecutive planned jobs a parameter must be off in" }
        }
    });
    all
}

fn main_schemas(int: &Value, time: &Value) -> Value {
    json!({
        "ErrorBody": {
            "type": "object", "required": ["error"],
            "properties": { "error": { "type": "string" } }
        },
        "DagErrorBody": {
            "type": "object", "required": ["error", "file", "field"],
            "properties": {
                "error": { "type": "string", "description": "file:line:column: field: why" },
                "file": { "type": "string" },
                "line": { "type": "integer", "nullable": true },
                "column": { "type": "integer", "nullable": true },
                "field": { "type": "string", "description": "e.g. functions[1].timeout; empty for the whole file" }
            }
        },
        "ControlHealth": {
            "type": "object", "required": ["status", "version"],
            "properties": { "status": { "type": "string", "enum": ["ok", "unavailable"] }, "version": { "type": "string" },
                "dilation": { "type": "number", "description": "the cluster's time dilation factor (1: none); times are in dilated time" } }
        },
        "DagSummary": {
            "type": "object",
            "required": ["name", "revision", "created_at_ms", "updated_at_ms"],
            "properties": {
                "name": { "type": "string" },
                "description": { "type": "string" },
                "functions": { "type": "array", "items": { "type": "string" } },
                "edges": { "type": "integer" },
                "revision": int.clone(),
                "created_at_ms": time.clone(),
                "updated_at_ms": time.clone()
            }
        },
        "DagList": {
            "type": "object", "required": ["dags"],
            "properties": { "dags": { "type": "array", "items": { "$ref": "#/components/schemas/DagSummary" } } }
        },
        "DagDetail": {
            "allOf": [
                { "$ref": "#/components/schemas/DagSummary" },
                {
                    "type": "object", "required": ["yaml", "parsed"],
                    "properties": {
                        "yaml": { "type": "string", "description": "the file as applied" },
                        "parsed": { "type": "object", "description": "the checked DAG" }
                    }
                }
            ]
        },
        "BandwidthReport": {
            "type": "object",
            "properties": {
                "egress_bps": { "type": "number", "nullable": true },
                "ingress_bps": { "type": "number", "nullable": true },
                "samples": int.clone()
            }
        },
        "Capacity": {
            "type": "object",
            "required": ["agent_id", "url", "vm_type", "vcpus", "memory_mb", "sandbox", "running", "bandwidth"],
            "properties": {
                "agent_id": { "type": "string", "pattern": "^[A-Za-z0-9._-]{1,64}$" },
                "url": { "type": "string", "description": "http:// or https:// URL peers and the control plane reach the agent at" },
                "vm_type": { "type": "string", "pattern": "^[A-Za-z0-9._-]{1,64}$" },
                "vcpus": { "type": "integer", "minimum": 1 },
                "memory_mb": { "type": "integer", "minimum": 1 },
                "network_mbps": { "type": "number", "nullable": true },
                "sandbox": { "type": "string" },
                "running": { "type": "integer" },
                "bandwidth": { "$ref": "#/components/schemas/BandwidthReport" }
            }
        },
        "Heartbeat": {
            "type": "object", "required": ["agent_id", "running", "bandwidth"],
            "properties": {
                "agent_id": { "type": "string" },
                "running": { "type": "integer" },
                "bandwidth": { "$ref": "#/components/schemas/BandwidthReport" }
            }
        },
        "RunReport": {
            "type": "object", "required": ["run_id", "status"],
            "properties": {
                "run_id": { "type": "string" },
                "status": { "type": "string", "enum": ["running", "succeeded", "failed", "out_of_memory", "timed_out", "error", "disk_full"] },
                "cold": { "type": "boolean", "nullable": true },
                "seconds": { "type": "number", "nullable": true },
                "start_latency_s": { "type": "number", "nullable": true },
                "setup_s": { "type": "number", "nullable": true, "description": "a handler stage: seconds spent fetching its code and building its environment before the sandbox started" },
                "start_contention": {
                    "type": "object", "required": ["starts", "cores"],
                    "description": "a cold run whose container the agent started for it: the container starts of the agent's process that overlapped that one (its own included) and the cores they shared (the Docker engine's CPUs); the control plane learns the start as if it had had a core to itself",
                    "properties": { "starts": int.clone(), "cores": int.clone() }
                },
                "peak_memory_mb": { "type": "number", "nullable": true },
                "warm": {
                    "type": "object", "required": ["idle", "keep_alive_s"],
                    "description": "what the agent keeps warm for the run's function once it ended: idle warm containers of its key and limits (prewarmed ones no run used left out), and how long it keeps an idle one",
                    "properties": { "idle": int.clone(), "keep_alive_s": int.clone(), "seq": { "type": "integer", "description": "orders the agent's counts: a later count has a larger number (0: not ordered)" } }
                },
                "exit_code": { "type": "integer", "nullable": true },
                "error": { "type": "string", "nullable": true },
                "staged": { "type": "array", "items": { "type": "object" } },
                "outputs": { "type": "array", "items": { "type": "object" } },
                "log": { "type": "string" }
            }
        },
        "AgentInfo": {
            "type": "object",
            "required": ["agent_id", "url", "vm_type", "alive", "registered_at_ms", "last_heartbeat_ms", "heartbeat_age_ms", "capacity"],
            "properties": {
                "agent_id": { "type": "string" },
                "url": { "type": "string" },
                "vm_type": { "type": "string" },
                "alive": { "type": "boolean" },
                "registered_at_ms": time.clone(),
                "last_heartbeat_ms": time,
                "heartbeat_age_ms": int.clone(),
                "capacity": { "$ref": "#/components/schemas/Capacity" }
            }
        },
        "Joined": {
            "description": "an AgentInfo, plus what a joining agent needs from a control plane that runs jobs",
            "allOf": [
                { "$ref": "#/components/schemas/AgentInfo" },
                {
                    "type": "object",
                    "properties": {
                        "join": {
                            "type": "object", "required": ["agent_token", "file_key"],
                            "properties": {
                                "agent_token": { "type": "string" },
                                "file_key": { "type": "string" },
                                "store": { "type": ["object", "null"], "description": "{\"s3\": {endpoint, region, bucket, access_key, secret_key}} or {\"local\": {root}}" }
                            }
                        }
                    }
                }
            ]
        },
        "AgentList": {
            "type": "object", "required": ["agents", "heartbeat_timeout_ms"],
            "properties": {
                "agents": { "type": "array", "items": { "$ref": "#/components/schemas/AgentInfo" } },
                "heartbeat_timeout_ms": { "type": "integer" }
            }
        },
        "SubmitJob": {
            "type": "object", "required": ["dag"], "additionalProperties": false,
            "properties": {
                "dag": { "type": "string" },
                "input": {
                    "type": "object", "additionalProperties": false,
                    "description": "exactly one of base64 (inline bytes) and key (an object in the store)",
                    "properties": {
                        "name": { "type": "string", "description": "the file name under input/" },
                        "base64": { "type": "string" },
                        "key": { "type": "string" }
                    }
                },
                "params": { "type": "object", "description": "overrides of the DAG's parameters" },
                "policy": {
                    "type": "string", "enum": ["remote", "direct", "local", "sonic", "oracle"],
                    "description": "forces a policy; without it: sonic (planned) once the DAG's models converged, remote (profiling) before; oracle (evaluation): planned with the parameters earlier jobs measured at this input size"
                },
                "planned": {
                    "type": "boolean", "default": false,
                    "description": "with a forced remote, direct or local: placed as the planner places that baseline (VM types by predicted memory, lambdas per VM), run through the resource manager (mode planned)"
                }
            }
        },
        "JobAccepted": {
            "type": "object", "required": ["job_id", "status"],
            "properties": { "job_id": { "type": "string" }, "status": { "type": "string" } }
        },
        "JobList": {
            "type": "object", "required": ["jobs"],
            "properties": { "jobs": { "type": "array", "items": { "$ref": "#/components/schemas/JobSummary" } } }
        },
        "JobSummary": {
            "type": "object",
            "description": "interfaces.md section 3; the measures are 0 and the lists empty until the job ends",
            "required": ["job_id", "dag", "status", "policy", "mode", "input_bytes", "latency_s",
                         "cost_usd", "perf_per_dollar", "edges", "functions", "outputs"],
            "properties": {
                "job_id": { "type": "string" }, "dag": { "type": "string" },
                "status": { "type": "string", "enum": ["queued", "running", "succeeded", "failed"] },
                "policy": { "type": "string" },
                "mode": { "type": "string", "enum": ["profiling", "planned"] },
                "input_bytes": int.clone(),
                "latency_s": { "type": "number" }, "cost_usd": { "type": "number" },
                "perf_per_dollar": { "type": "number" },
                "edges": { "type": "array", "items": { "type": "object" } },
                "functions": { "type": "array", "items": { "type": "object" } },
                "outputs": { "type": "array", "items": { "type": "string" } },
                "error": { "type": "string" },
                "plan": { "$ref": "#/components/schemas/JobPlan" },
                "mode_reason": { "type": "string", "description": "why the job ran in its mode: the DAG's mode and why (models converged; not yet; a drift), or the forced policy" }
            }
        },
        "JobPlan": {
            "type": "object", "required": ["used", "notes", "report", "stages"],
            "description": "how a sonic job was planned and placed",
            "properties": {
                "used": { "type": "string", "enum": ["best", "second_best", "none"], "description": "second_best: a vm-storage placement of the best plan could not be granted; none: planning failed and the job profiled" },
                "notes": { "type": "array", "items": { "type": "string" }, "description": "why: refused vm-storage, substituted VM types, shared VMs" },
                "report": { "$ref": "#/components/schemas/PlanReport" },
                "stages": { "type": "array", "items": { "$ref": "#/components/schemas/StageHosts" } },
                "exact": { "type": "boolean", "description": "false: the planning budget stopped the search and the job runs the best plan found within it (report.stopped says which limit); absent when nothing was planned" }
            }
        },
        "StageHosts": {
            "type": "object", "required": ["function", "vm_type", "agents", "concurrent", "memory_limit_mb"],
            "properties": {
                "function": { "type": "string" },
                "vm_type": { "type": "string" },
                "agents": { "type": "array", "items": { "type": "string" }, "description": "one agent id per VM of the plan" },
                "concurrent": { "type": "integer" },
                "memory_limit_mb": int.clone(),
                "warm": { "type": "boolean", "description": "the plan priced its first batch hot: its agents kept enough warm containers of the function (absent: false)" }
            }
        },
        "PlanReport": {
            "type": "object",
            "description": "interfaces.md section 3 (`ofctl plan -o json`), plus input_bytes, models_converged, network_mbps (per VM type: the bandwidth used and its source, measured or catalog), warm_pool, baselines (a job's plan: per baseline policy, its prediction or error) and vm_limits (when re-planned under the pool); a job's plan that ran its second-best plan has it at the top level and the best one under `best`",
            "required": ["dag", "policy", "stages", "edges", "predicted", "planning_time_us"],
            "properties": {
                "dag": { "type": "string" },
                "policy": { "type": "string" },
                "stages": { "type": "array", "items": { "type": "object" } },
                "edges": { "type": "array", "items": { "type": "object" } },
                "predicted": { "type": "object" },
                "timing": { "type": "array", "items": { "type": "object" }, "description": "per stage, the predicted timing: function, ready_s (its last sender ended), start_s, upload_s, wait_s, fetch_s, compute_s, end_s = ready_s + upload_s + wait_s + fetch_s + compute_s, batches" },
                "second_best": { "type": "object", "nullable": true },
                "planning_time_us": int.clone(),
                "exact": { "type": "boolean", "description": "whether the plan is proven optimal; false: a limit of the planning budget stopped the search and this is the best plan found within it" },
                "stopped": { "type": "object", "nullable": true, "description": "the limit that stopped a search: limit (time with ms, memory with bytes, expansions with max) and search (best, second_best)" },
                "input_bytes": int,
                "models_converged": { "type": "boolean" },
                "network_mbps": { "type": "object" },
                "warm_pool": { "type": "object", "description": "what the alive agents kept warm for the DAG's functions when it was planned (what `warm` on stages was priced on): per function, one entry per agent with idle warm containers of it: agent, vm_type, idle" }
            }
        },
        "ModelView": {
            "type": "object", "required": ["parameter", "samples", "converged"],
            "properties": {
                "parameter": { "type": "string", "description": "pca.memory_mb, pca.cold_s, pca.hot_s, pca.instances, pca->train.bytes" },
                "equation": { "type": "string", "nullable": true, "description": "the polynomial in the input size x (bytes)" },
                "degree": { "type": "integer", "nullable": true },
                "cv_mape": { "type": "number", "nullable": true, "description": "cross-validated mean absolute percentage error (0.12 = 12%)" },
                "samples": { "type": "integer" },
                "converged": { "type": "boolean" }
            }
        },
        "DagModelsView": {
            "type": "object", "required": ["dag", "converged", "max_mape", "jobs", "models"],
            "properties": {
                "dag": { "type": "string" },
                "converged": { "type": "boolean" },
                "max_mape": { "type": "number" },
                "jobs": { "type": "integer" },
                "models": { "type": "array", "items": { "$ref": "#/components/schemas/ModelView" } },
                "samples": { "type": "array", "items": { "type": "object" }, "description": "the samples the models are fitted on, one per finished job: job, input_bytes, measured, created_ms" },
                "mode": { "$ref": "#/components/schemas/DagModeView" },
                "setting": { "type": "string", "description": "the parameter setting the top level describes (a job with the DAG's default parameters): its canonical key, e.g. {\"trees\":6}; empty without work parameters" },
                "params": { "type": "object", "description": "that setting's work parameter values" },
                "settings": { "type": "array", "items": { "$ref": "#/components/schemas/SettingModelsView" }, "description": "every parameter setting learned, each profiled, converged and watched for drift on its own" }
            }
        },
        "SettingModelsView": {
            "type": "object", "required": ["setting", "label", "params", "converged", "jobs", "models"],
            "properties": {
                "setting": { "type": "string", "description": "the canonical key" },
                "label": { "type": "string", "description": "for people: trees=12" },
                "params": { "type": "object" },
                "converged": { "type": "boolean" },
                "jobs": { "type": "integer" },
                "models": { "type": "array", "items": { "$ref": "#/components/schemas/ModelView" } },
                "mode": { "$ref": "#/components/schemas/DagModeView" }
            }
        },
        "JobEvent": {
            "type": "object", "required": ["job_id", "status", "done_instances", "total_instances"],
            "properties": {
                "job_id": { "type": "string" },
                "status": { "type": "string", "enum": ["queued", "running", "succeeded", "failed"] },
                "stage": { "type": "string", "description": "the function of the stage running" },
                "done_instances": { "type": "integer" },
                "total_instances": { "type": "integer" },
                "message": { "type": "string" }
            }
        },
        "InstanceLog": {
            "type": "object", "required": ["function", "instance", "attempt", "agent", "log"],
            "properties": {
                "function": { "type": "string" },
                "instance": { "type": "integer" },
                "attempt": { "type": "integer" },
                "agent": { "type": "string" },
                "log": { "type": "string" }
            }
        },
        "JobLogs": {
            "type": "object", "required": ["job_id", "logs"],
            "properties": {
                "job_id": { "type": "string" },
                "logs": { "type": "array", "items": { "$ref": "#/components/schemas/InstanceLog" } }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::api::routes;

    /// Every route of the router is in the document with its guard, and nothing else is.
    #[test]
    fn document_matches_the_route_table() {
        let doc = document();
        let paths = doc["paths"].as_object().expect("paths");
        let table = routes();
        for r in &table {
            let method = r.method.as_str().to_ascii_lowercase();
            let op = &paths
                .get(r.path)
                .unwrap_or_else(|| panic!("{} missing from the document", r.path))[&method];
            assert!(
                op.is_object(),
                "{method} {} missing from the document",
                r.path
            );
            let public = op["security"].as_array().is_some_and(Vec::is_empty);
            assert_eq!(
                public,
                !r.guard.needs_token(),
                "{method} {}: security does not match the guard",
                r.path
            );
            if r.guard.needs_token() {
                assert!(
                    op["responses"]["401"].is_object(),
                    "{method} {} lacks 401",
                    r.path
                );
            }
            assert!(op["operationId"].is_string());
        }
        let mut documented = 0;
        for (path, item) in paths {
            for method in item.as_object().expect("path item").keys() {
                documented += 1;
                assert!(
                    table
                        .iter()
                        .any(|r| r.path == path && r.method.as_str().eq_ignore_ascii_case(method)),
                    "{method} {path} documented but not routed"
                );
            }
        }
        assert_eq!(documented, table.len());
    }

    #[test]
    fn every_reference_resolves_and_ids_are_unique() {
        let doc = document();
        let mut refs = Vec::new();
        let mut ids = Vec::new();
        fn walk(v: &Value, refs: &mut Vec<String>, ids: &mut Vec<String>) {
            match v {
                Value::Object(m) => {
                    for (k, v) in m {
                        match (k.as_str(), v) {
                            ("$ref", Value::String(s)) => refs.push(s.clone()),
                            ("operationId", Value::String(s)) => ids.push(s.clone()),
                            _ => walk(v, refs, ids),
                        }
                    }
                }
                Value::Array(a) => a.iter().for_each(|v| walk(v, refs, ids)),
                _ => {}
            }
        }
        walk(&doc, &mut refs, &mut ids);
        assert!(!refs.is_empty());
        for r in refs {
            let name = r
                .strip_prefix("#/components/schemas/")
                .unwrap_or_else(|| panic!("unexpected ref {r}"));
            assert!(
                doc["components"]["schemas"][name].is_object(),
                "{r} does not resolve"
            );
        }
        let n = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), n, "operationId repeated");
    }
}
