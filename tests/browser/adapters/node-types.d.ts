// What `ai`'s declarations (which ai-sdk.d.ts imports its model types from) take from Node's
// types, for its server helpers (ServerResponse) and binary data (Buffer): this check runs on the
// browser's lib without @types/node.
declare module 'node:http' {
  export class ServerResponse {}
}
declare module 'http' {
  export class ServerResponse {}
}
declare class Buffer extends Uint8Array {}
