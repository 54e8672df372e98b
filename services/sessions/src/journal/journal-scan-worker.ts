/** The scanning worker thread of journal-scan.ts: runs each job it is sent, one after another. */
import { parentPort } from "node:worker_threads";
import { runScanJob, type ScanJob } from "./journal-scan.js";

parentPort?.on("message", (job: ScanJob) => runScanJob(job));
