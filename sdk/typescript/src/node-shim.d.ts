// Minimal declarations of the Node built-ins the SDK uses (so the build needs no @types/node).
// Only used internally: nothing in the public API refers to these types.
declare module "node:fs" {
  export function openAsBlob(path: string, options?: { type?: string }): Promise<Blob>;
}
declare module "node:fs/promises" {
  interface FileHandle {
    write(buffer: Uint8Array): Promise<{ bytesWritten: number }>;
    close(): Promise<void>;
  }
  export function open(path: string, flags?: string, mode?: number): Promise<FileHandle>;
  export function unlink(path: string): Promise<void>;
  export function writeFile(path: string, data: Uint8Array | string): Promise<void>;
}
