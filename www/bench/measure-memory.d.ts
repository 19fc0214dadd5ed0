// performance.measureUserAgentSpecificMemory() (Chromium's, in cross-origin isolated pages), which
// monitor.js calls where the browser has it: TypeScript's DOM lib does not declare it yet. Only
// for the type-check (www/tsconfig.pages.json).

interface MemoryAttribution {
  scope: string;
  url?: string;
}

interface MemoryBreakdownEntry {
  bytes: number;
  attribution: MemoryAttribution[];
  types: string[];
}

interface MemoryMeasurement {
  bytes: number;
  breakdown: MemoryBreakdownEntry[];
}

interface Performance {
  measureUserAgentSpecificMemory?(): Promise<MemoryMeasurement>;
}
