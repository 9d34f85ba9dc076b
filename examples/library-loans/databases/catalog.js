/** The catalog every fresh loan desk database starts with (inserted once; later starts keep it). */
export const BOOKS = [
  { isbn: 'K-01', title: 'The Name of the Rose', author: 'Umberto Eco' },
  { isbn: 'K-02', title: 'Invisible Cities', author: 'Italo Calvino' },
  { isbn: 'K-03', title: 'The Left Hand of Darkness', author: 'Ursula K. Le Guin' },
  { isbn: 'K-04', title: 'Ficciones', author: 'Jorge Luis Borges' },
  { isbn: 'K-05', title: 'Beloved', author: 'Toni Morrison' },
  { isbn: 'K-06', title: 'The Master and Margarita', author: 'Mikhail Bulgakov' },
  { isbn: 'K-07', title: 'Things Fall Apart', author: 'Chinua Achebe' },
  { isbn: 'K-08', title: 'Pedro Páramo', author: 'Juan Rulfo' },
  { isbn: 'K-09', title: 'The Remains of the Day', author: 'Kazuo Ishiguro' },
  { isbn: 'K-10', title: 'Snow Country', author: 'Yasunari Kawabata' },
];

export const MEMBERS = [
  { id: 'U-1001', name: 'Ada Okafor' },
  { id: 'U-1002', name: 'Bruno Salgado' },
  { id: 'U-1003', name: 'Chen Wei' },
  { id: 'U-1004', name: 'Dilnoza Karimova' },
  { id: 'U-1005', name: 'Emil Lindqvist' },
  { id: 'U-1006', name: 'Fatima Haddad' },
  { id: 'U-1007', name: 'Gideon Mensah' },
  { id: 'U-1008', name: 'Hana Novak' },
  { id: 'U-1009', name: 'Ines Duarte' },
  { id: 'U-1010', name: 'Jonas Weber' },
];

/** How long a keyed loan's intent holds it when no retention is given: the desk's default `IDEMPOTENCY_TTL`. */
export const DEFAULT_INTENT_TTL_MS = 24 * 60 * 60 * 1000;
