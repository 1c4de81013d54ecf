// An Express app with nothing but its code, package.json and package-lock.json: `wakeful
// deploy examples/express` builds it (a Node stack), then
// `curl http://express.localhost:8080/`.
const express = require("express");

const app = express();
app.get("/", (req, res) => res.json({ hello: "from express", greeting: process.env.GREETING || "" }));
app.get("/healthz", (req, res) => res.json({ status: "ok" }));

const server = app.listen(Number(process.env.PORT || 8080), "0.0.0.0");
// wakeful stops a sandbox with SIGTERM: finish what is in flight, then exit.
process.on("SIGTERM", () => server.close(() => process.exit(0)));
